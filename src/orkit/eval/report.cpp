// The self-contained HTML report: per-benchmark Pass@1 bars and a stacked failure breakdown (inline SVG).
#include <fmt/format.h>

#include <cmath>

#include "orkit/eval/runner.h"

namespace trex::orkit::eval {

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

const char* status_colour(const std::string& s) {
  if (s == "correct") return "#2e7d32";
  if (s == "wrong") return "#c62828";
  if (s == "infeasible") return "#ef6c00";
  if (s == "unbounded") return "#f9a825";
  if (s == "error") return "#6a1b9a";
  if (s == "timeout") return "#1565c0";
  return "#757575";  // no_code
}

const char* kStatuses[] = {"correct", "wrong", "infeasible", "unbounded", "error", "timeout", "no_code"};

}  // namespace

std::string html_report(const std::vector<BenchmarkScore>& scores, const nlohmann::json& meta) {
  const int row_h = 26, label_w = 230, bar_w = 520;
  const int h = int(scores.size()) * row_h + 30;
  std::string svg = fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}">)",
                                label_w + bar_w + 90, h);
  for (size_t i = 0; i < scores.size(); ++i) {
    const auto& s = scores[i];
    const int y = int(i) * row_h + 5;
    const double w = bar_w * s.pass_at_1() / 100.0;
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="13" text-anchor="end">{}</text>)", label_w - 8,
                       y + 16, esc(s.name));
    svg += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="#eee"/>)", label_w, y, bar_w,
                       row_h - 6);
    svg += fmt::format(R"(<rect x="{}" y="{}" width="{:.1f}" height="{}" fill="#2e7d32"/>)", label_w, y, w,
                       row_h - 6);
    svg += fmt::format(R"(<text x="{}" y="{}" font-size="13">{:.2f}%</text>)", label_w + bar_w + 6, y + 16,
                       s.pass_at_1());
  }
  svg += "</svg>";

  // Stacked status breakdown per benchmark.
  std::string svg2 = fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{}">)",
                                 label_w + bar_w + 20, h + 30);
  for (size_t i = 0; i < scores.size(); ++i) {
    const auto& s = scores[i];
    const int y = int(i) * row_h + 5;
    svg2 += fmt::format(R"(<text x="{}" y="{}" font-size="13" text-anchor="end">{}</text>)", label_w - 8,
                        y + 16, esc(s.name));
    double x = label_w;
    for (const char* st : kStatuses) {
      auto it = s.status_counts.find(st);
      if (it == s.status_counts.end() || s.scored == 0) continue;
      const double w = double(bar_w) * it->second / s.scored;
      svg2 += fmt::format(
          R"(<rect x="{:.1f}" y="{}" width="{:.1f}" height="{}" fill="{}"><title>{}: {}</title></rect>)", x,
          y, w, row_h - 6, status_colour(st), st, it->second);
      x += w;
    }
  }
  {
    double x = label_w;
    const int y = int(scores.size()) * row_h + 12;
    for (const char* st : kStatuses) {
      svg2 += fmt::format(R"(<rect x="{:.0f}" y="{}" width="12" height="12" fill="{}"/>)", x, y,
                          status_colour(st));
      svg2 += fmt::format(R"(<text x="{:.0f}" y="{}" font-size="12">{}</text>)", x + 15, y + 11, st);
      x += 80;
    }
  }
  svg2 += "</svg>";

  std::string rows;
  for (const auto& s : scores) {
    std::string details;
    for (const auto& [k, n] : s.detail_counts) details += fmt::format("{} {}<br>", esc(k), n);
    rows += fmt::format(
        "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><b>{:.2f}%</b></td><td>{}</"
        "td><td>{}</td></tr>\n",
        esc(s.name), esc(s.display_name), s.scored, s.skipped_no_ground_truth, s.correct, s.pass_at_1(),
        esc(rule_description(s.rule)), details);
  }
  std::string meta_html;
  if (meta.is_object())
    for (const auto& [k, v] : meta.items())
      meta_html +=
          fmt::format("<li><b>{}</b>: {}</li>", esc(k), esc(v.is_string() ? v.get<std::string>() : v.dump()));
  return fmt::format(R"(<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>trex eval report</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top;font-size:13px}}</style></head>
<body><h1>trex eval: zero-shot Pass@1</h1><ul>{}</ul>
<h2>Pass@1 per benchmark</h2>{}
<h2>Outcome breakdown</h2>{}
<h2>Details</h2><table><tr><th>file</th><th>benchmark</th><th>scored</th><th>skipped (no ground truth)</th>
<th>correct</th><th>Pass@1</th><th>rule</th><th>failures (status:detail)</th></tr>
{}</table></body></html>
)",
                     meta_html, svg, svg2, rows);
}

}  // namespace trex::orkit::eval
