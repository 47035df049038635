// End to end through the CLI: tokenizer train -> data prepare -> train (stop) -> train again (resume).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "train/metrics.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

static int sh(const std::string& cmd, std::string* out = nullptr) {
  const bool merge = cmd.find("2>&1") != std::string::npos;
  std::FILE* p = ::popen((merge ? cmd : cmd + " 2>/dev/null").c_str(), "r");
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) s.append(buf, n);
  int rc = ::pclose(p);
  if (out) *out = s;
  return WEXITSTATUS(rc);
}

TEST(Cli, TokenizerDataTrainAndResume) {
  const std::string bin = TREX_BINARY;
  fs::path d = fs::temp_directory_path() / ("trex_cli_train_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  {
    std::ofstream f(d / "sft.jsonl");
    for (int i = 0; i < 30; ++i)
      f << json{{"messages", {{{"role", "user"}, {"content", "What is " + std::to_string(i) + " plus 1?"}},
                              {{"role", "assistant"}, {"content", "It is " + std::to_string(i + 1) + "."}}}}}.dump()
        << "\n";
  }
  std::string out;
  ASSERT_EQ(sh(bin + " tokenizer train --input " + (d / "sft.jsonl").string() + " --vocab-size 320 --out " +
                   (d / "tok.json").string(), &out), 0) << out;
  ASSERT_EQ(sh(bin + " tokenizer encode --tokenizer " + (d / "tok.json").string() + " 'It is 5.'", &out), 0);
  auto ids = json::parse(out);
  ASSERT_TRUE(ids.is_array());
  ASSERT_EQ(sh(bin + " tokenizer decode --tokenizer " + (d / "tok.json").string() + " '" + ids.dump() + "'", &out), 0);
  EXPECT_EQ(out, "It is 5.\n");
  ASSERT_EQ(sh(bin + " data prepare --tokenizer " + (d / "tok.json").string() + " --input " +
                   (d / "sft.jsonl").string() + " --seq-len 64 --out " + (d / "shards").string(), &out), 0) << out;
  EXPECT_EQ(json::parse(out)["documents"], 30);
  std::ofstream(d / "run.yaml") << "model: {type: toy, hidden: 8}\n"
                                << "data: {shards: " << (d / "shards").string() << ", tokenizer: "
                                << (d / "tok.json").string() << ", seq_len: 64, batch_size: 2}\n"
                                << "schedule: {lr: 0.01, min_lr: 0.001, warmup_steps: 1}\n"
                                << "train: {max_steps: 6}\ncheckpoint: {every: 2}\n";
  const std::string train = bin + " train " + (d / "run.yaml").string() + " --out " + (d / "run").string() + " --no-progress";
  ASSERT_EQ(sh(train + " --max-steps 3", &out), 0) << out;
  EXPECT_EQ(json::parse(out)["end_step"], 3);
  ASSERT_EQ(sh(train, &out), 0) << out;
  json r = json::parse(out);
  EXPECT_EQ(r["resumed"], true);
  EXPECT_EQ(r["start_step"], 3);
  EXPECT_EQ(r["end_step"], 6);
  EXPECT_EQ(trex::train::read_jsonl(d / "run" / "metrics.jsonl").size(), 6u);
  EXPECT_TRUE(fs::exists(d / "run" / "loss.html"));
  // A malformed config is reported with its file and line, exit code 1.
  std::ofstream(d / "bad.yaml") << "model: {type: toy}\ndata:\n  seq_len: [\n";
  EXPECT_EQ(sh(bin + " train " + (d / "bad.yaml").string() + " --out " + (d / "bad").string() + " 2>&1", &out), 1);
  EXPECT_NE(out.find("bad.yaml:3:"), std::string::npos) << out;
  fs::remove_all(d);
}
