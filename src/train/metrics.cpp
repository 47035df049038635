#include "train/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "core/error.h"
#include "core/files.h"

#ifdef TREX_HAVE_PNG
#include <png.h>
#endif

namespace trex::train {

using json = nlohmann::json;
namespace fs = std::filesystem;

void append_jsonl(const fs::path& path, const json& j) {
  std::FILE* f = std::fopen(path.c_str(), "ab");
  TREX_CHECK(f != nullptr, "{}: cannot open for appending", path.string());
  const std::string line = j.dump() + "\n";
  const bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size();
  std::fclose(f);
  TREX_CHECK(ok, "{}: write failed", path.string());
}

std::vector<json> read_jsonl(const fs::path& path) {
  std::vector<json> out;
  std::ifstream f(path);
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.empty()) continue;
    try {
      out.push_back(json::parse(line));
    } catch (const json::exception& e) {
      fail("{}:{}: {}", path.string(), n, e.what());
    }
  }
  return out;
}

void truncate_metrics(const fs::path& path, int64_t last_step) {
  if (!fs::exists(path)) return;
  std::string kept;
  for (const auto& j : read_jsonl(path))
    if (!j.contains("step") || j["step"].get<int64_t>() <= last_step) kept += j.dump() + "\n";
  write_text_atomic(path, kept);
}

namespace {
struct Series {
  std::vector<double> x, y;
};

#ifdef TREX_HAVE_PNG
void write_png(const fs::path& path, const Series& s, double xmin, double xmax, double ymin, double ymax) {
  const int W = 800, H = 400, L = 50, R = 20, T = 20, B = 40;
  std::vector<uint8_t> img(size_t(W * H * 3), 255);
  auto put = [&](int x, int y, uint8_t r, uint8_t g, uint8_t b) {
    if (x < 0 || y < 0 || x >= W || y >= H) return;
    uint8_t* p = &img[size_t((y * W + x) * 3)];
    p[0] = r, p[1] = g, p[2] = b;
  };
  for (int x = L; x < W - R; ++x) put(x, H - B, 0, 0, 0);
  for (int y = T; y <= H - B; ++y) put(L, y, 0, 0, 0);
  for (int k = 1; k <= 4; ++k)  // light grid
    for (int x = L + 1; x < W - R; x += 2) put(x, H - B - k * (H - B - T) / 4, 200, 200, 200);
  auto px = [&](double x) { return L + int(std::lround((x - xmin) / (xmax - xmin) * (W - L - R))); };
  auto py = [&](double y) { return H - B - int(std::lround((y - ymin) / (ymax - ymin) * (H - B - T))); };
  for (size_t i = 1; i < s.x.size(); ++i) {
    int x0 = px(s.x[i - 1]), y0 = py(s.y[i - 1]), x1 = px(s.x[i]), y1 = py(s.y[i]);
    int steps = std::max(std::abs(x1 - x0), std::abs(y1 - y0)) + 1;
    for (int t = 0; t <= steps; ++t) {
      int x = x0 + (x1 - x0) * t / steps, y = y0 + (y1 - y0) * t / steps;
      put(x, y, 31, 119, 180), put(x, y + 1, 31, 119, 180);
    }
  }
  write_file_atomic(path, [&](std::FILE* f) {
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
    png_infop info = png_create_info_struct(png);
    TREX_CHECK(png && info, "libpng: cannot create writer");
    if (setjmp(png_jmpbuf(png))) {
      png_destroy_write_struct(&png, &info);
      fail("{}: libpng write failed", path.string());
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, W, H, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
                 PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < H; ++y) png_write_row(png, &img[size_t(y * W * 3)]);
    png_write_end(png, nullptr);
    png_destroy_write_struct(&png, &info);
  });
}
#endif
}  // namespace

std::vector<fs::path> write_loss_plot(const fs::path& metrics, const fs::path& out_dir, const std::string& title) {
  Series s;
  for (const auto& j : read_jsonl(metrics))
    if (j.contains("step") && j.contains("loss") && j["loss"].is_number()) {
      double y = j["loss"].get<double>();
      if (std::isfinite(y)) s.x.push_back(j["step"].get<double>()), s.y.push_back(y);
    }
  std::vector<fs::path> written;
  if (s.x.empty()) return written;
  double xmin = s.x.front(), xmax = std::max(s.x.back(), xmin + 1);
  double ymin = *std::min_element(s.y.begin(), s.y.end()), ymax = *std::max_element(s.y.begin(), s.y.end());
  if (ymax - ymin < 1e-9) ymax = ymin + 1;
  const double pad = 0.05 * (ymax - ymin);
  ymin -= pad, ymax += pad;
  const int W = 800, H = 400, L = 60, R = 20, T = 30, B = 40;
  auto px = [&](double x) { return L + (x - xmin) / (xmax - xmin) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - ymin) / (ymax - ymin) * (H - B - T); };
  std::string pts;
  for (size_t i = 0; i < s.x.size(); ++i) pts += fmt::format("{:.1f},{:.1f} ", px(s.x[i]), py(s.y[i]));
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
      "<line x1=\"{2}\" y1=\"{3}\" x2=\"{4}\" y2=\"{3}\" stroke=\"black\"/>\n"
      "<line x1=\"{2}\" y1=\"{5}\" x2=\"{2}\" y2=\"{3}\" stroke=\"black\"/>\n",
      W, H, L, H - B, W - R, T);
  for (int k = 0; k <= 4; ++k) {
    double yv = ymin + (ymax - ymin) * k / 4, xv = xmin + (xmax - xmin) * k / 4;
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.3g}</text>\n", L - 5, py(yv) + 4, yv);
    svg += fmt::format("<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>\n", L, py(yv), W - R, py(yv));
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:.0f}</text>\n", px(xv), H - B + 16, xv);
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n", (L + W - R) / 2, H - 5);
  svg += fmt::format("<text x=\"{}\" y=\"18\" text-anchor=\"middle\">{} (loss)</text>\n", (L + W - R) / 2, title);
  svg += fmt::format("<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n</svg>\n", pts);
  const std::string html = fmt::format(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{0}</title></head><body>\n{1}"
      "<p>{2} steps, first loss {3:.4f}, last loss {4:.4f}, min {5:.4f}</p>\n</body></html>\n",
      title, svg, s.x.size(), s.y.front(), s.y.back(), *std::min_element(s.y.begin(), s.y.end()));
  write_text_atomic(out_dir / "loss.html", html);
  written.push_back(out_dir / "loss.html");
#ifdef TREX_HAVE_PNG
  write_png(out_dir / "loss.png", s, xmin, xmax, ymin, ymax);
  written.push_back(out_dir / "loss.png");
#endif
  return written;
}

}  // namespace trex::train
