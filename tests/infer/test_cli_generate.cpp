// `trex generate` end to end: ids in/out reproduces the fixture's greedy decode, text in/out with a
// tokenizer (chat format, thinking on), and clear errors for bad arguments.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "data/bpe_trainer.h"
#include "infer_test_util.h"

using namespace trex;

namespace {

struct RunResult {
  int code = -1;
  std::string out;  // stdout + stderr
};

RunResult run_trex(const std::string& args) {
  RunResult r;
  const std::string cmd = std::string(TREX_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

class CliGenerate : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(TREX_BINARY))
      GTEST_SKIP() << "the trex binary is not built: " << TREX_BINARY;
  }
};

TEST_F(CliGenerate, PromptIdsReproduceTheFixtureGreedyDecode) {
  const auto dir = test::dsv4_fixture("tiny");
  ckpt::SafetensorsReader io(dir / "io.safetensors");
  const auto prompt = test::int_rows(io, "generate.prompt_ids")[0];
  const auto expected = test::int_rows(io, "generate.output_ids")[0];
  std::string ids, want;
  for (size_t i = 0; i < prompt.size(); ++i) ids += (i ? "," : "") + std::to_string(prompt[i]);
  for (size_t i = 0; i < expected.size(); ++i) want += (i ? "," : "") + std::to_string(expected[i]);
  const RunResult r = run_trex("generate --model " + dir.string() + " --prompt-ids " + ids +
                               " --max-new-tokens 12 --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(("\n" + r.out).find("\n" + want + "\n"), std::string::npos)
      << "expected the line " << want << " in\n"
      << r.out;
  EXPECT_NE(r.out.find("tok/s"), std::string::npos);
}

TEST_F(CliGenerate, ChatTextWithATokenizer) {
  data::BpeTrainOptions bo;
  bo.vocab_size = 300;
  data::BpeTrainer trainer(bo);
  for (int i = 0; i < 20; ++i) trainer.add_text("the warehouse ships to the customer at minimum cost ");
  const auto tok_path =
      std::filesystem::temp_directory_path() / ("trex-infer-tok-" + std::to_string(getpid()) + ".json");
  trainer.train().save(tok_path);
  const RunResult r = run_trex(
      "generate --model " + test::dsv4_fixture("tiny").string() + " --tokenizer " + tok_path.string() +
      " --prompt 'ship to the customer' --chat --thinking --max-new-tokens 6 --temperature 0.7 "
      "--top-p 0.9 --seed 3");
  std::filesystem::remove(tok_path);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("prompt "), std::string::npos) << r.out;
}

TEST_F(CliGenerate, BadArgumentsFailClearly) {
  const std::string m = " --model " + test::dsv4_fixture("tiny").string();
  RunResult r = run_trex("generate" + m + " --prompt hello");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("needs a tokenizer"), std::string::npos) << r.out;
  r = run_trex("generate" + m + " --prompt-ids 1,x,3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("'x' is not a token id"), std::string::npos) << r.out;
  r = run_trex("generate" + m + " --prompt-ids 1,2 --max-context 8 --max-new-tokens 7");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("context limit"), std::string::npos) << r.out;
  r = run_trex("generate --model /nonexistent --prompt-ids 1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("config.json"), std::string::npos) << r.out;
}

}  // namespace
