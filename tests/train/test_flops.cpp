// The trainer's FLOPs per token (used by `trex train` and `trex bench train` for MFU) against the convention of
// ../shared/bench/model_flops.py, read off the baseline table of ../shared/bench/README.md: model TFLOP/s divided by
// tokens/s (small-s6 @4096: 60.2e12 / 14,991; flash-l4 @8192: 66.2e12 / 6,258). The table rounds to 3 digits.
#include <gtest/gtest.h>

#include "core/files.h"
#include "model/dsv4/config.h"
#include "train/dsv4_trainable.h"

TEST(Flops, BenchConfigsMatchTheBaselineTableConvention) {
  const auto bench = trex::shared_dir() / "bench";
  if (!trex::fs::exists(bench / "flash-l4.json")) GTEST_SKIP() << "no " << bench;
  const double small = trex::train::dsv4_flops_per_token(trex::dsv4::load_model_config(bench / "small-s6.json"), 4096);
  const double flash = trex::train::dsv4_flops_per_token(trex::dsv4::load_model_config(bench / "flash-l4.json"), 8192);
  EXPECT_NEAR(small / (60.2e12 / 14991.0), 1.0, 5e-3) << small;
  EXPECT_NEAR(flash / (66.2e12 / 6258.0), 1.0, 5e-3) << flash;
}
