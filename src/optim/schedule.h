// Learning-rate schedule: linear warm-up, then constant until decay_start, then cosine / linear decay
// to min_lr at total_steps (DeepSeek-V4 uses warm-up -> constant -> cosine, design §5). Also the MTP
// loss weight, which drops when the LR decay starts.
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace trex::optim {

struct ScheduleConfig {
  std::string kind = "cosine";  // cosine | linear | constant
  double lr = 3e-4;
  double min_lr = 3e-5;
  int64_t warmup_steps = 0;
  int64_t decay_start = -1;     // -1: right after warm-up
  int64_t total_steps = 0;      // 0: taken from the run's step count
  double mtp_weight = 0.3, mtp_weight_after_decay = 0.1;
};

ScheduleConfig parse_schedule_config(const nlohmann::json& j, const std::string& where);
double lr_at(const ScheduleConfig& c, int64_t step);          // step counts from 0
double mtp_weight_at(const ScheduleConfig& c, int64_t step);

}  // namespace trex::optim
