// The trainer on the toy model: gradients, YAML configs, loss falling, bit-exact resume, atomic
// checkpoints under interruption, pruning, spike handling, metrics and plot.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "data/bpe_trainer.h"
#include "data/chat.h"
#include "data/shards.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/state_checkpoint.h"
#include "train/toy_model.h"
#include "train/trainer.h"
#include "train/yaml.h"

using namespace trex;
using namespace trex::train;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("trex_train_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A corpus with learnable bigram structure, its tokenizer and shards, built once per test binary.
struct Fixture {
  fs::path dir;
  data::Tokenizer tok;
  std::unique_ptr<data::ShardDataset> ds;
  Fixture() {
    dir = temp_dir("fixture");
    const char* words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"};
    std::ofstream f(dir / "corpus.jsonl");
    uint64_t s = 1;
    for (int doc = 0; doc < 120; ++doc) {
      std::string text;
      int w = int(data::splitmix64(s) % 8);
      for (int i = 0; i < 12; ++i, w = (w + 1 + int(data::splitmix64(s) % 2)) % 8) text += std::string(words[w]) + " ";
      f << json{{"text", text}}.dump() << "\n";
    }
    f.close();
    data::BpeTrainOptions o;
    o.vocab_size = 300;
    data::BpeTrainer tr(o);
    std::ifstream in(dir / "corpus.jsonl");
    std::string line;
    while (std::getline(in, line)) tr.add_text(json::parse(line)["text"].get<std::string>());
    tok = tr.train();
    data::PrepareOptions po;
    po.seq_len = 32;
    po.rows_per_shard = 16;
    data::prepare_shards(tok, {dir / "corpus.jsonl"}, dir / "shards", po);
    ds = std::make_unique<data::ShardDataset>(dir / "shards");
  }
  ~Fixture() { fs::remove_all(dir); }
};
Fixture& fx() {
  static Fixture f;
  return f;
}

TrainConfig toy_config(const std::string& extra = "") {
  std::string yaml = R"(
seed: 7
model:
  type: toy
  hidden: 16
data:
  shards: unused     # the tests pass the dataset directly
  tokenizer: unused
  seq_len: 32
  batch_size: 4
optimizer:
  kind: muon
  adamw: {eps: 1.0e-8, weight_decay: 0.0}
  muon: {weight_decay: 0.0}
schedule: {kind: cosine, lr: 0.01, min_lr: 0.001, warmup_steps: 2}
train:
  max_steps: 8
checkpoint:
  every: 4
  keep_last: 2
logging:
  plot: true
)" + extra;
  return parse_train_config(parse_yaml(yaml, "toy.yaml"), "toy.yaml");
}

std::vector<float> weights(ToyLM& m) {
  std::vector<float> w;
  for (const auto& p : m.params()) w.insert(w.end(), p.value, p.value + p.numel());
  return w;
}

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> l;
  for (const auto& j : read_jsonl(metrics)) l.push_back(j["loss"].get<double>());
  return l;
}

TrainerOptions quiet(int64_t stop = -1) {
  TrainerOptions o;
  o.stop_at = stop;
  o.show_progress = false;
  return o;
}

}  // namespace

TEST(Yaml, SubsetParsesToJsonAndErrorsNameTheLine) {
  json j = parse_yaml(R"(# comment
a: 1
b:
  c: "x # not a comment"   # a comment
  d: [1, 2.5, three, "four"]
  e: {f: true, g: null}
list:
  - 1e-3
  - name: x
    size: 2
  -
    - nested
s: 'it''s'
)", "t.yaml");
  EXPECT_EQ(j["a"], 1);
  EXPECT_EQ(j["b"]["c"], "x # not a comment");
  EXPECT_EQ(j["b"]["d"], json::parse(R"([1, 2.5, "three", "four"])"));
  EXPECT_EQ(j["b"]["e"], json::parse(R"({"f": true, "g": null})"));
  EXPECT_DOUBLE_EQ(j["list"][0].get<double>(), 1e-3);
  EXPECT_EQ(j["list"][1], json::parse(R"({"name": "x", "size": 2})"));
  EXPECT_EQ(j["list"][2], json::parse(R"(["nested"])"));
  EXPECT_EQ(j["s"], "it's");
  auto err = [](const std::string& y) {
    try {
      parse_yaml(y, "bad.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err("a: 1\na: 2\n").find("bad.yaml:2: duplicate key 'a'"), std::string::npos);
  EXPECT_NE(err("a:\n\tb: 1\n").find("bad.yaml:2: tab"), std::string::npos);
  EXPECT_NE(err("a: 1\n   b: 2\n").find("bad.yaml:2:"), std::string::npos);
  EXPECT_NE(err("a: [1, 2\n").find("bad.yaml:1:"), std::string::npos);
  EXPECT_NE(err("a: |\n  text\n").find("bad.yaml:1:"), std::string::npos);
  // Config validation names the unknown key.
  try {
    parse_train_config(parse_yaml("model: {type: toy}\ndata: {shards: x, tokenizer: y}\noptimiser: {}\n", "c.yaml"), "c.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'optimiser'"), std::string::npos) << e.what();
  }
  // The training device: cpu (default) or cuda, anything else named.
  const std::string base = "model: {type: toy}\ndata: {shards: x, tokenizer: y}\n";
  EXPECT_EQ(parse_train_config(parse_yaml(base, "c.yaml"), "c.yaml").device, "cpu");
  EXPECT_EQ(parse_train_config(parse_yaml(base + "device: cuda\n", "c.yaml"), "c.yaml").device, "cuda");
  try {
    parse_train_config(parse_yaml(base + "device: tpu\n", "c.yaml"), "c.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device 'tpu' (expected cpu or cuda)"), std::string::npos) << e.what();
  }
}

TEST(ToyLM, GradientMatchesFiniteDifferences) {
  ToyLM m(12, 5, 3, 0.3);
  data::Batch b;
  b.batch = 1, b.seq = 6;
  b.input_ids = {1, 4, 7, 2, 11, 0};
  b.labels = {-1, 4, 7, -1, 11, 0};  // aligned with the ids; -1 at each document start
  b.pos = {0, 1, 2, 0, 1, 2};
  b.doc_start = {1, 0, 0, 1, 0, 0};
  b.n_targets = 4;
  m.zero_grads();
  m.forward_backward(b);
  for (auto& p : m.params()) {
    for (int64_t i = 0; i < p.numel(); i += std::max<int64_t>(1, p.numel() / 7)) {
      const float keep = p.value[i];
      const double h = 1e-3;
      p.value[i] = float(keep + h);
      double lp = m.loss(b);
      p.value[i] = float(keep - h);
      double lm = m.loss(b);
      p.value[i] = keep;
      EXPECT_NEAR(p.grad[i], (lp - lm) / (2 * h), 2e-3) << p.name << "[" << i << "]";
    }
  }
}

TEST(Trainer, LossFallsAndOutputsAreWritten) {
  fs::path out = temp_dir("falls");
  TrainConfig cfg = toy_config();
  cfg.max_steps = 30;
  cfg.schedule.total_steps = 30;
  ToyLM m(fx().tok.vocab_size(), 16, cfg.seed);
  TrainResult r = Trainer(cfg, out, m, *fx().ds, 1, quiet()).run();
  EXPECT_EQ(r.end_step, 30);
  EXPECT_LT(r.last_loss, 0.7 * r.first_loss) << r.first_loss << " -> " << r.last_loss;
  auto lines = read_jsonl(out / "metrics.jsonl");
  ASSERT_EQ(lines.size(), 30u);
  for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens", "tokens_per_s"}) EXPECT_TRUE(lines[5].contains(k)) << k;
  EXPECT_EQ(lines[5]["tokens"], 6 * 4 * 32);
  EXPECT_TRUE(fs::exists(out / "loss.html"));
  EXPECT_NE(read_text_file(out / "loss.html").find("<polyline"), std::string::npos);
  // keep_last 2: only the two newest checkpoints remain.
  int n = 0;
  for (const auto& e : fs::directory_iterator(out / "checkpoints")) n += e.path().filename().string().rfind("step_", 0) == 0;
  EXPECT_EQ(n, 2);
  EXPECT_EQ(latest_checkpoint(out / "checkpoints")->filename(), "step_00000030");
  fs::remove_all(out);
}

TEST(Trainer, ResumeIsBitExact) {
  for (const char* kind : {"muon", "adamw"}) {
    fs::path a = temp_dir(std::string("resume_a_") + kind), b = temp_dir(std::string("resume_b_") + kind);
    TrainConfig cfg = toy_config();
    cfg.optimizer.kind = kind;
    cfg.grad_accum = 2;
    ToyLM ma(fx().tok.vocab_size(), 16, cfg.seed);
    Trainer(cfg, a, ma, *fx().ds, 1, quiet()).run();  // 8 steps in one go
    {
      ToyLM mb(fx().tok.vocab_size(), 16, cfg.seed);
      TrainResult r1 = Trainer(cfg, b, mb, *fx().ds, 1, quiet(4)).run();  // stop after 4
      EXPECT_EQ(r1.end_step, 4);
    }
    ToyLM mb2(fx().tok.vocab_size(), 16, cfg.seed);  // a fresh process would start from the init again
    TrainResult r2 = Trainer(cfg, b, mb2, *fx().ds, 1, quiet()).run();
    EXPECT_TRUE(r2.resumed);
    EXPECT_EQ(r2.start_step, 4);
    EXPECT_EQ(weights(ma), weights(mb2)) << kind;  // bit-identical
    EXPECT_EQ(losses(a / "metrics.jsonl"), losses(b / "metrics.jsonl")) << kind;
    fs::remove_all(a);
    fs::remove_all(b);
  }
}

TEST(Checkpoint, InterruptedWriteLeavesThePreviousCheckpointIntact) {
  fs::path out = temp_dir("interrupt");
  TrainConfig cfg = toy_config();
  ToyLM m(fx().tok.vocab_size(), 16, cfg.seed);
  TrainerOptions o = quiet();
  o.checkpoint_fault = [](std::string_view stage) {
    static int saves = 0;
    if (stage == "model") ++saves;
    if (saves == 2 && stage == "optimizer") throw Error("simulated crash while writing the optimizer state");
  };
  EXPECT_THROW(Trainer(cfg, out, m, *fx().ds, 1, o).run(), Error);
  auto last = latest_checkpoint(out / "checkpoints");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->filename(), "step_00000004");
  for (const auto& e : fs::directory_iterator(out / "checkpoints"))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  // The surviving checkpoint loads and resumes to the end.
  ToyLM m2(fx().tok.vocab_size(), 16, cfg.seed);
  TrainResult r = Trainer(cfg, out, m2, *fx().ds, 1, quiet()).run();
  EXPECT_EQ(r.start_step, 4);
  EXPECT_EQ(r.end_step, 8);

  // A writer process killed in the middle of a save (after the model file, before state.json).
  fs::path out2 = temp_dir("killed");
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ToyLM mc(fx().tok.vocab_size(), 16, cfg.seed);
    TrainerOptions oc = quiet();
    oc.checkpoint_fault = [](std::string_view stage) {
      static int saves = 0;
      if (stage == "model") ++saves;
      if (saves == 2 && stage == "state") ::_exit(3);
    };
    Trainer(cfg, out2, mc, *fx().ds, 1, oc).run();
    ::_exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_EQ(latest_checkpoint(out2 / "checkpoints")->filename(), "step_00000004");
  ToyLM m3(fx().tok.vocab_size(), 16, cfg.seed);
  TrainResult r3 = Trainer(cfg, out2, m3, *fx().ds, 1, quiet()).run();  // the dead writer's temp dir is ignored
  EXPECT_EQ(r3.start_step, 4);
  EXPECT_EQ(weights(m2), weights(m3));
  fs::remove_all(out);
  fs::remove_all(out2);
}

// Wraps the toy model and reports a huge loss on one chosen call, like a corrupted batch would.
class SpikyToy : public ToyLM {
 public:
  using ToyLM::ToyLM;
  int64_t calls = 0, spike_call = -1;
  StepStats forward_backward(const data::Batch& b) override {
    StepStats s = ToyLM::forward_backward(b);
    if (calls++ == spike_call) {
      s.loss *= 50;
      for (auto& p : params())
        for (int64_t i = 0; i < p.numel(); ++i) p.grad[i] *= 50;
    }
    return s;
  }
};

TEST(Trainer, SpikeIsSkippedOrRolledBack) {
  for (const char* action : {"skip", "rollback"}) {
    fs::path out = temp_dir(std::string("spike_") + action);
    TrainConfig cfg = toy_config(std::string("spike: {action: ") + action + ", min_history: 4, z_threshold: 4}\n");
    cfg.max_steps = 12;
    cfg.schedule.total_steps = 12;
    SpikyToy m(fx().tok.vocab_size(), 16, cfg.seed);
    m.spike_call = 9;  // the 10th batch
    std::vector<float> before;
    TrainResult r = Trainer(cfg, out, m, *fx().ds, 1, quiet()).run();
    EXPECT_EQ(r.spikes, 1) << action;
    auto ev = read_jsonl(out / "events.jsonl");
    ASSERT_FALSE(ev.empty());
    EXPECT_EQ(ev.back()["event"], "spike");
    EXPECT_EQ(ev.back()["step"], 9);
    auto lines = read_jsonl(out / "metrics.jsonl");
    ASSERT_EQ(lines.size(), 12u);
    for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["step"], int64_t(i + 1));
    if (std::string(action) == "skip") {
      EXPECT_TRUE(lines[9].value("skipped", false));
      EXPECT_EQ(r.rollbacks, 0);
    } else {
      EXPECT_EQ(r.rollbacks, 1);
      EXPECT_EQ(ev.back()["to_step"], 8);  // the newest checkpoint before the spike
      for (const auto& l : lines) EXPECT_LT(l["loss"].get<double>(), 20.0);  // the spiked step was replaced
    }
    fs::remove_all(out);
  }
}
