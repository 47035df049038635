// `trex train CONFIG --out DIR`: builds the tokenizer, data (preparing shards into DIR/data when the
// config names JSONL), the model (dsv4 or toy) and runs the Trainer; running it again with the same DIR
// resumes from the newest checkpoint there. DIR/config.json records the resolved config; a resume whose
// model, data or seed differ from it is refused.
#pragma once
#include <cstdint>
#include <filesystem>

#include "train/trainer.h"

namespace trex::train {

struct RunOptions {
  int64_t max_steps = -1;  // stop after this many total steps (-1: the config's train.max_steps)
  bool show_progress = true;
};

TrainResult run_training(const std::filesystem::path& config, const std::filesystem::path& out_dir,
                         const RunOptions& opts = {});

}  // namespace trex::train
