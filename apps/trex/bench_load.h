// `trex bench load`: the GPU checkpoint loader (GpuModel::load_checkpoint) on one emulated rank of a large layout.
#pragma once
#include <cstdint>
#include <string>

namespace trex::bench {

struct LoadBenchArgs {
  std::string config;                       // the released model's config.json (e.g. ../shared/bench/v4-flash.json)
  std::string dir;                          // the checkpoint: written here (released format) unless it exists
  int64_t layers = 1;                       // main layers of the written checkpoint
  std::string layout = "pp=4,dp=32,ep=32";  // the real layout whose rank is emulated
  int rank = 0;                             // the emulated rank
  int64_t staging_mb = 256;
  int64_t block = 128;                      // FP8 block of a written checkpoint
};
void bench_load(const LoadBenchArgs& a);

}  // namespace trex::bench
