#include "orkit/gen/report.h"

#include <algorithm>

#include <fmt/format.h>

namespace trex::orkit::gen {
namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string value_str(const nlohmann::ordered_json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// A two-column table of label -> count with proportional bars.
std::string count_table(const std::string& title, const nlohmann::ordered_json& counts) {
  if (!counts.is_object() || counts.empty()) return "";
  double maxv = 1;
  for (auto& [k, v] : counts.items())
    if (v.is_number()) maxv = std::max(maxv, v.get<double>());
  std::string h = "<h3>" + esc(title) + "</h3>\n<table>\n";
  for (auto& [k, v] : counts.items()) {
    const double x = v.is_number() ? v.get<double>() : 0;
    h += fmt::format("<tr><td>{}</td><td class=n>{}</td><td><div class=bar style=\"width:{}px\"></div></td></tr>\n",
                     esc(k), esc(value_str(v)), static_cast<int>(300 * x / maxv));
  }
  return h + "</table>\n";
}

}  // namespace

std::string html_report(const nlohmann::ordered_json& s) {
  std::string h =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>trex ordata report</title>\n<style>"
      "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin-bottom:1em}"
      "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:left}td.n{text-align:right}"
      ".bar{background:#4a7;height:10px}section{display:inline-block;vertical-align:top;margin-right:2em}"
      "</style></head><body>\n<h1>trex ordata: generation report</h1>\n";
  h += "<table>";
  for (const char* k : {"profile", "seed", "shard", "requested", "kept", "attempts", "rejected"})
    if (s.contains(k)) h += fmt::format("<tr><td>{}</td><td class=n>{}</td></tr>", k, esc(value_str(s[k])));
  h += "</table>\n<h2>Kept samples</h2>\n";
  if (s.contains("kept_by"))
    for (auto& [k, v] : s["kept_by"].items()) h += "<section>" + count_table("by " + k, v) + "</section>\n";
  h += "<h2>Lengths (characters)</h2>\n";
  if (s.contains("lengths"))
    for (auto& [k, v] : s["lengths"].items()) h += "<section>" + count_table(k, v) + "</section>\n";
  h += "<h2>Rejections</h2>\n";
  if (s.contains("rejections")) {
    const auto& r = s["rejections"];
    if (r.contains("by_reason")) h += "<section>" + count_table("by reason", r["by_reason"]) + "</section>\n";
    if (r.contains("by_family"))
      h += "<section>" + count_table("by family", r["by_family"]) + "</section>\n";
    if (r.contains("examples") && !r["examples"].empty()) {
      h += "<h3>Examples</h3><table><tr><th>index</th><th>family</th><th>reason</th><th>detail</th></tr>\n";
      for (const auto& e : r["examples"])
        h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", value_str(e["index"]),
                         esc(value_str(e["family"])), esc(value_str(e["reason"])), esc(value_str(e["detail"])));
      h += "</table>\n";
    }
  }
  h += "<h2>Decontamination</h2>\n";
  if (s.contains("decontamination")) {
    const auto& d = s["decontamination"];
    h += "<table>";
    for (auto& [k, v] : d.items())
      if (!v.is_object()) h += fmt::format("<tr><td>{}</td><td class=n>{}</td></tr>", esc(k), esc(value_str(v)));
    h += "</table>\n";
    if (d.contains("histogram")) h += "<section>" + count_table("n-gram containment", d["histogram"]) + "</section>\n";
    if (d.contains("max_by_benchmark"))
      h += "<section>" + count_table("highest containment per benchmark", d["max_by_benchmark"]) + "</section>\n";
  }
  h += "<h2>CPT corpus</h2>\n";
  if (s.contains("cpt")) {
    h += "<table>";
    for (auto& [k, v] : s["cpt"].items())
      h += fmt::format("<tr><td>{}</td><td class=n>{}</td></tr>", esc(k), esc(value_str(v)));
    h += "</table>\n";
  }
  return h + "</body></html>\n";
}

}  // namespace trex::orkit::gen
