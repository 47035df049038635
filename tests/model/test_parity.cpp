// The parity comparison (model/dsv4/parity.h) on the golden fixtures (transformers 5.17, float64) passes, and
// `trex parity` on a perturbed copy reports the failure with a non-zero exit.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

#include "core/files.h"
#include "model/dsv4/parity.h"

namespace {

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), int(buf.size()), p)) out += buf.data();
  *status = pclose(p);
  return out;
}

}  // namespace

// The library comparison (dsv4::parity_cpu, what `trex parity` prints).
static nlohmann::json parity_of(const trex::fs::path& dir) {
  trex::dsv4::ParityOptions o;
  o.model_dir = dir, o.io_file = dir / "io.safetensors", o.grads_file = dir / "grads.safetensors";
  return trex::dsv4::parity_cpu(o);
}

TEST(Parity, TinyFixtureMatchesTransformers) {
  const auto dir = trex::shared_dir() / "fixtures" / "deepseek-v4" / "tiny";
  if (!trex::fs::exists(dir / "io.safetensors")) GTEST_SKIP() << "fixture not found at " << dir;
  const auto j = parity_of(dir);
  const std::string out = j.dump();
  EXPECT_TRUE(j.at("pass").get<bool>()) << out;
  EXPECT_LT(std::fabs(j.at("loss").get<double>() - j.at("loss_ref").get<double>()), 1e-5);
  EXPECT_LT(j.at("logits_max_rel_err").get<double>(), 1e-4);
  EXPECT_LT(j.at("hidden_max_rel_err").get<double>(), 1e-4);
  EXPECT_LT(j.at("worst_grad").at("rel_err").get<double>(), 1e-3);
  EXPECT_EQ(j.at("topk_match").get<double>(), 1.0);
  EXPECT_EQ(j.at("grads_compared").get<int>(), 128);
  // The indexer tensors of the two CSA layers (6 each) have no reference gradient and must be reported.
  EXPECT_EQ(j.at("no_reference_grad").size(), 12u);
}

// The extra fixtures made by tests/fixtures/make_more_fixtures.py with the same reference: 3 and 2 mHC streams,
// other widths, windows, rates, top-k, batch 3 and a sequence length that fills no window evenly.
class ParityOtherShapes : public ::testing::TestWithParam<const char*> {};

TEST_P(ParityOtherShapes, MatchesTransformers) {
  const auto dir = trex::source_dir() / "tests" / "fixtures" / "deepseek-v4" / GetParam();
  ASSERT_TRUE(trex::fs::exists(dir / "io.safetensors")) << dir;
  const auto j = parity_of(dir);
  const std::string out = j.dump();
  EXPECT_TRUE(j.at("pass").get<bool>()) << out;
  EXPECT_EQ(j.at("topk_match").get<double>(), 1.0) << out;
  EXPECT_GT(j.at("grads_compared").get<int>(), 50) << out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParityOtherShapes, ::testing::Values("v4-tiny-b", "v4-tiny-c"));

TEST(Parity, FailsWhenAWeightIsPerturbed) {
  // Copy the fixture, add 0.25 to one element of the final norm weight in model.safetensors: the logits move
  // far past the tolerance, so the command must report pass=false and exit non-zero.
  const auto src = trex::shared_dir() / "fixtures" / "deepseek-v4" / "tiny";
  if (!trex::fs::exists(src / "io.safetensors")) GTEST_SKIP() << "fixture not found at " << src;
  const auto dir = trex::fs::temp_directory_path() / ("trex-parity-perturbed-" + std::to_string(::getpid()));
  trex::fs::remove_all(dir);
  trex::fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"}) trex::fs::copy_file(src / f, dir / f);
  {
    std::string bytes = trex::read_text_file(dir / "model.safetensors");
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes.data(), 8);
    const auto header = nlohmann::json::parse(bytes.substr(8, header_len));
    const auto& t = header.at("model.norm.weight");
    ASSERT_EQ(t.at("dtype"), "F32");
    const size_t at = 8 + header_len + t.at("data_offsets").at(0).get<size_t>();
    float v;
    std::memcpy(&v, bytes.data() + at, 4);
    v += 0.25f;
    std::memcpy(bytes.data() + at, &v, 4);
    trex::write_text_atomic(dir / "model.safetensors", bytes);
  }
  int status = 0;
  const std::string out = run(std::string(TREX_BINARY) + " parity --model " + dir.string() + " --io " +
                                  (src / "io.safetensors").string() + " --threads 2",
                              &status);
  trex::fs::remove_all(dir);
  ASSERT_FALSE(out.empty());
  const auto j = nlohmann::json::parse(out);
  EXPECT_FALSE(j.at("pass").get<bool>()) << out;
  EXPECT_GT(j.at("logits_max_rel_err").get<double>(), 1e-4) << out;
  EXPECT_NE(status, 0);
}

TEST(Parity, FailsOnAnIoFileWithoutInputs) {
  // The grads file lacks input_ids: the command must exit non-zero with an error, not pass.
  const auto dir = trex::shared_dir() / "fixtures" / "deepseek-v4" / "tiny";
  if (!trex::fs::exists(dir / "io.safetensors")) GTEST_SKIP() << "fixture not found at " << dir;
  int status = 0;
  run(std::string(TREX_BINARY) + " parity --model " + dir.string() + " --io " + (dir / "grads.safetensors").string() +
          " 2>/dev/null",
      &status);
  EXPECT_NE(status, 0);
}
