#include "optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace trex::optim {

ScheduleConfig parse_schedule_config(const nlohmann::json& j, const std::string& where) {
  ScheduleConfig c;
  if (j.is_null()) return c;
  TREX_CHECK(j.is_object(), "{}: schedule: expected a mapping", where);
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    try {
      if (k == "kind") c.kind = it->get<std::string>();
      else if (k == "lr") c.lr = it->get<double>();
      else if (k == "min_lr") c.min_lr = it->get<double>();
      else if (k == "warmup_steps") c.warmup_steps = it->get<int64_t>();
      else if (k == "decay_start") c.decay_start = it->get<int64_t>();
      else if (k == "total_steps") c.total_steps = it->get<int64_t>();
      else if (k == "mtp_weight") c.mtp_weight = it->get<double>();
      else if (k == "mtp_weight_after_decay") c.mtp_weight_after_decay = it->get<double>();
      else fail("{}: schedule: unknown key '{}'", where, k);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: schedule.{}: {}", where, k, e.what());
    }
  }
  TREX_CHECK(c.kind == "cosine" || c.kind == "linear" || c.kind == "constant",
             "{}: schedule.kind '{}' (expected cosine, linear or constant)", where, c.kind);
  TREX_CHECK(c.lr > 0 && c.min_lr >= 0 && c.warmup_steps >= 0, "{}: schedule: need lr > 0, min_lr >= 0, warmup >= 0",
             where);
  return c;
}

static int64_t decay_start_of(const ScheduleConfig& c) { return c.decay_start >= 0 ? c.decay_start : c.warmup_steps; }

double lr_at(const ScheduleConfig& c, int64_t step) {
  if (step < c.warmup_steps) return c.lr * double(step + 1) / double(c.warmup_steps);
  const int64_t start = std::max(decay_start_of(c), c.warmup_steps);
  if (c.kind == "constant" || step < start) return c.lr;
  const int64_t span = c.total_steps - start;
  if (span <= 0) return c.min_lr;
  const double p = std::clamp(double(step - start) / double(span), 0.0, 1.0);
  if (c.kind == "linear") return c.lr + (c.min_lr - c.lr) * p;
  return c.min_lr + (c.lr - c.min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

double mtp_weight_at(const ScheduleConfig& c, int64_t step) {
  if (c.kind == "constant") return c.mtp_weight;
  return step < std::max(decay_start_of(c), c.warmup_steps) ? c.mtp_weight : c.mtp_weight_after_decay;
}

}  // namespace trex::optim
