// The trainer's FLOPs per token (used by `trex train` and `trex bench train` for MFU) against the convention of
// ../shared/bench/model_flops.py, read off the baseline table of ../shared/bench/README.md: model TFLOP/s divided by
// tokens/s (small-s6 @4096: 60.2e12 / 14,991; flash-l4 @8192: 66.2e12 / 6,258). The table rounds to 3 digits.
#include <gtest/gtest.h>

#include "core/error.h"
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

// A pipeline stage's share (rank emulation's MFU): the stages of a partition add up to the whole model, the head
// stage carries the LM head, and a layer's share does not depend on which stage holds it.
TEST(Flops, StageSharesAddUpToTheModel) {
  const auto path = trex::shared_dir() / "bench" / "v4-flash.json";
  if (!trex::fs::exists(path)) GTEST_SKIP() << "no " << path;
  const trex::dsv4::ModelConfig c = trex::dsv4::load_model_config(path);
  const double whole = trex::train::dsv4_flops_per_token(c, 4096);
  const int64_t cuts[] = {0, 11, 22, 33, 43};
  double sum = 0;
  for (int s = 0; s < 4; ++s) sum += trex::train::dsv4_stage_flops_per_token(c, 4096, cuts[s], cuts[s + 1], s == 3);
  EXPECT_NEAR(sum / whole, 1.0, 1e-12);
  const double head = trex::train::dsv4_stage_flops_per_token(c, 4096, 43, 43, true);
  EXPECT_NEAR(head, 3 * 2 * double(c.hidden) * double(c.vocab_size + c.hc_mult * c.hc_mult), 1e-6 * head);
  EXPECT_GT(trex::train::dsv4_stage_flops_per_token(c, 4096, 0, 1, false), 0);
  EXPECT_THROW(trex::train::dsv4_stage_flops_per_token(c, 4096, 40, 44, true), trex::Error);
}
