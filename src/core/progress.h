// A progress bar on stderr with count, rate, ETA and free-form fields (loss, tokens/s, ...).
// On a terminal it redraws one line; otherwise it prints a line at most every few seconds.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace trex {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit = "it");
  void update(int64_t done, const std::string& extra = "");  // absolute position
  void advance(int64_t n = 1, const std::string& extra = "") { update(done_ + n, extra); }
  void finish(const std::string& extra = "");

 private:
  void draw(bool final);
  std::string label_, unit_, extra_;
  int64_t total_, done_ = 0, start_done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool tty_, finished_ = false;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12.3s"

}  // namespace trex
