#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace trex {

std::string format_duration(double s) {
  if (s < 0 || s != s) return "?";
  if (s < 60) return fmt::format("{:.1f}s", s);
  auto t = int64_t(s);
  if (t < 3600) return fmt::format("{}m{:02d}s", t / 60, int(t % 60));
  return fmt::format("{}h{:02d}m", t / 3600, int((t % 3600) / 60));
}

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total),
      start_(std::chrono::steady_clock::now()), last_draw_(start_), tty_(::isatty(2)) {}

void ProgressBar::update(int64_t done, const std::string& extra) {
  if (done_ == 0 && start_done_ == 0 && done > 0 && total_ > 0 && done == total_) start_done_ = 0;
  done_ = done;
  if (!extra.empty()) extra_ = extra;
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_draw_).count();
  if ((tty_ && since > 0.1) || since > 5.0 || done_ >= total_) draw(false);
}

void ProgressBar::finish(const std::string& extra) {
  if (finished_) return;
  if (!extra.empty()) extra_ = extra;
  draw(true);
  finished_ = true;
}

void ProgressBar::draw(bool final) {
  last_draw_ = std::chrono::steady_clock::now();
  double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  double rate = elapsed > 0 ? double(done_ - start_done_) / elapsed : 0.0;
  double eta = rate > 0 && total_ > 0 ? double(total_ - done_) / rate : -1;
  std::string bar;
  if (total_ > 0) {
    int width = 24, filled = int(width * std::min(1.0, double(done_) / double(total_)));
    bar = "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
  }
  std::string line = fmt::format("{} {} {}/{} {:.2f} {}/s elapsed {} eta {}{}{}", label_, bar, done_, total_,
                                 rate, unit_, format_duration(elapsed), final ? "0s" : format_duration(eta),
                                 extra_.empty() ? "" : " | ", extra_);
  if (tty_) {
    std::fprintf(stderr, "\r\033[2K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace trex
