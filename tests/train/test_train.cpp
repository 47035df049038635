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
#include "data/sampler.h"
#include "data/shards.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/run.h"
#include "train/state_checkpoint.h"
#include "train/local_engine.h"
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

// `recompute:` none (default) | selective | full; another value or type is an error naming the file and the key.
TEST(Config, RecomputeParsesTheThreeModesAndNamesTheKeyOfABadOne) {
  const std::string base = "model: {type: toy}\ndata: {shards: x, tokenizer: y}\n";
  auto parse = [&](const std::string& extra) { return parse_train_config(parse_yaml(base + extra, "c.yaml"), "c.yaml"); };
  EXPECT_EQ(parse("").recompute, dsv4::Recompute::None);
  EXPECT_EQ(parse("recompute: none\n").recompute, dsv4::Recompute::None);
  EXPECT_EQ(parse("recompute: selective\n").recompute, dsv4::Recompute::Selective);
  EXPECT_EQ(parse("recompute: full\n").recompute, dsv4::Recompute::Full);
  EXPECT_EQ(parse("recompute: full\n").recompute_full_layers, -1);
  EXPECT_EQ(parse("recompute: full\nrecompute_full_layers: 20\n").recompute_full_layers, 20);
  for (const char* bad : {"recompute: selective\nrecompute_full_layers: 3\n", "recompute: full\nrecompute_full_layers: -2\n"}) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("recompute_full_layers"), std::string::npos) << e.what();
    }
  }
  for (const char* bad : {"recompute: partial\n", "recompute: 1\n", "recompute: [full]\n"}) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("c.yaml"), std::string::npos) << m;
      EXPECT_NE(m.find("recompute"), std::string::npos) << m;
      EXPECT_NE(m.find("none, selective or full"), std::string::npos) << m;
    }
  }
}

// data.long_chats: truncate (default) | drop (data/shards.h); another value names the file and the key.
TEST(Config, LongChatsIsTruncateByDefaultOrDropAndNamesTheKeyOfABadOne) {
  auto parse = [](const std::string& data) {
    return parse_train_config(parse_yaml("model: {type: toy}\ndata: {shards: x, tokenizer: y" + data + "}\n", "c.yaml"),
                              "c.yaml");
  };
  EXPECT_EQ(parse("").long_chats, data::LongChats::Truncate);
  EXPECT_EQ(parse(", long_chats: drop").long_chats, data::LongChats::Drop);
  try {
    parse(", long_chats: split");
    ADD_FAILURE() << "accepted long_chats: split";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("c.yaml: data"), std::string::npos) << m;
    EXPECT_NE(m.find("long_chats 'split' (expected truncate or drop)"), std::string::npos) << m;
  }
}

// The CPU model keeps every activation: a CPU run with recompute selective / full is refused before anything is
// built, saying it is the GPU's.
TEST(Trainer, RecomputeOnTheCpuIsRefusedBeforeTheRunStarts) {
  fs::path dir = temp_dir("cpu_recompute");
  const fs::path cfg = dir / "run.yaml";
  std::ofstream(cfg) << "seed: 1\nrecompute: full\nmodel: {type: toy}\ndata: {shards: " << (dir / "none").string()
                     << ", tokenizer: none.json, seq_len: 32, batch_size: 2}\ntrain: {max_steps: 1}\n";
  RunOptions o;
  o.show_progress = false;
  try {
    run_training(cfg, dir / "out", o);
    ADD_FAILURE() << "device cpu with recompute: full was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("run.yaml"), std::string::npos) << m;
    EXPECT_NE(m.find("recompute: full"), std::string::npos) << m;
    EXPECT_NE(m.find("GPU only"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir / "out")) << "refused before the run directory is made";
  fs::remove_all(dir);
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

// The loop is the same whatever engine runs the step (train/step_engine.h): a rank of a two-rank layout that runs
// the second of each step's two micro-batches gets exactly those rows, its spike rollback goes through the
// engine's load() and a barrier (as the mesh engine's ranks do), the step time and the engine's slowest-rank
// timings are maximised over the ranks, and only the lead rank writes metrics and events while every rank
// saves its checkpoint.
namespace {
struct RankEngine final : StepEngine {
  RankEngine(Trainable& m, const TrainConfig& cfg, bool is_lead)
      : inner(m, cfg.optimizer, cfg.freeze), lead_(is_lead) {}
  LocalEngine inner;
  bool lead_;
  int64_t loads = 0, barriers = 0, saves = 0, maxed = 0;
  std::vector<std::vector<int32_t>> seen;  // the input ids of every micro-batch this rank ran
  std::string describe() const override { return "rank 1 of 2"; }
  int64_t n_params() const override { return inner.n_params(); }
  int64_t n_trained() const override { return inner.n_trained(); }
  double flops_per_token(int64_t s) const override { return inner.flops_per_token(s); }
  int ranks() const override { return 2; }
  bool lead() const override { return lead_; }
  bool runs_micro_batch(int64_t micro, int64_t n_micro) const override { return micro == n_micro - 1; }
  void begin_step(const StepControls& c) override { inner.begin_step(c); }
  EngineStep forward_backward(const std::vector<data::Batch>& mine, int64_t n_micro) override {
    for (const auto& b : mine) seen.push_back(b.input_ids);
    EngineStep r = inner.forward_backward(mine, n_micro);
    r.slowest = {{"pipeline_bubble_s", 0.25}};
    r.extra = {{"bubble_fraction", 0.5}};
    return r;
  }
  double clip_gradients() override { return inner.clip_gradients(); }
  void optimizer_step(double lr) override { inner.optimizer_step(lr); }
  void save(const fs::path& root, const TrainState& st, int64_t keep, const FaultHook& f) override {
    ++saves;
    inner.save(root, st, keep, f);
  }
  TrainState load(const fs::path& dir) override {
    ++loads;
    return inner.load(dir);
  }
  void barrier() override { ++barriers; }
  void max_over_ranks(double* v, int n) override {
    ++maxed;
    ASSERT_EQ(n, 2);          // the step time, then the engine's one slowest-rank timing
    EXPECT_EQ(v[1], 0.25);
    v[1] = 0.75;              // another rank was slower
  }
};
}  // namespace

TEST(Trainer, OneLoopOverAnyEngineDealsMicroBatchesRollsBackAndReports) {
  for (bool lead : {true, false}) {
    fs::path out = temp_dir(std::string("engine_") + (lead ? "lead" : "other"));
    TrainConfig cfg = toy_config("spike: {action: rollback, min_history: 4, z_threshold: 4}\n");
    cfg.grad_accum = 2;
    cfg.max_steps = 12;
    cfg.schedule.total_steps = 12;
    SpikyToy m(fx().tok.vocab_size(), 16, cfg.seed);
    m.spike_call = 9;  // this rank's 10th micro-batch: step 10
    RankEngine eng(m, cfg, lead);
    TrainResult r = Trainer(cfg, out, eng, *fx().ds, 1, quiet()).run();
    EXPECT_EQ(r.spikes, 1);
    EXPECT_EQ(r.rollbacks, 1);
    EXPECT_EQ(eng.loads, 1);       // no checkpoint at the start: the only load is the rollback's
    EXPECT_EQ(eng.barriers, 2);    // after the reload, and at the end
    EXPECT_EQ(eng.saves, 3);       // steps 4, 8 and 12, on every rank
    EXPECT_EQ(eng.maxed, 13);      // every completed step: 9, the spike's rollback to 8, then 4
    // The rows: micro-batch 1 of each step, from the one sampler sequence (the rolled-back step's data is not
    // re-used: step 9 after the rollback continues past it).
    data::Sampler s(fx().ds->rows(), cfg.seed);
    std::vector<std::vector<int32_t>> want;
    data::Batch b;
    for (int i = 0; i < 14; ++i) {  // steps 1-10 (10 spiked), then 9-12 again on new data
      s.next_rows(cfg.batch_size);
      data::make_batch(*fx().ds, s.next_rows(cfg.batch_size), 1, b);
      want.push_back(b.input_ids);
    }
    EXPECT_EQ(eng.seen, want);
    if (lead) {
      auto lines = read_jsonl(out / "metrics.jsonl");
      ASSERT_EQ(lines.size(), 12u);
      for (const auto& l : lines) {
        EXPECT_EQ(l["pipeline_bubble_s"].get<double>(), 0.75);  // the slowest rank's
        EXPECT_EQ(l["bubble_fraction"].get<double>(), 0.5);
        EXPECT_NEAR(l["tokens_per_s_per_rank"].get<double>(), l["tokens_per_s"].get<double>() / 2, 1e-9);
        EXPECT_LT(l["loss"].get<double>(), 20.0);  // the spiked step was replaced
      }
      auto ev = read_jsonl(out / "events.jsonl");
      ASSERT_FALSE(ev.empty());
      EXPECT_EQ(ev.back()["event"], "spike");
      EXPECT_EQ(ev.back()["to_step"], 8);
    } else {
      EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));
      EXPECT_FALSE(fs::exists(out / "events.jsonl"));
      EXPECT_TRUE(fs::exists(out / "checkpoints"));
    }
    fs::remove_all(out);
  }
}

// `trex train --device cuda` with a parallel section runs the GPU mesh engine (pp / dp); a layout it does not run
// (here fully sharded dense weights) is refused before anything is built, naming what is missing (train/gpu_mesh_config.h).
TEST(Trainer, DeviceCudaWithAParallelSectionIsRefusedWithWhatIsMissing) {
  fs::path dir = temp_dir("cuda_mesh");
  const fs::path cfg = dir / "run.yaml";
  std::ofstream(cfg) << "seed: 1\nmodel: {type: dsv4, balance_alpha: 0}\ndata: {shards: " << (dir / "none").string()
                     << ", tokenizer: none.json, seq_len: 32, batch_size: 2, grad_accum: 2}\n"
                        "optimizer: {kind: adamw}\ntrain: {max_steps: 1}\nparallel: {dp: 4, ep: 3}\n";
  RunOptions o;
  o.device = "cuda";
  o.show_progress = false;
  try {
    run_training(cfg, dir / "out", o);
    ADD_FAILURE() << "device cuda with expert parallelism that does not divide dp was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("run.yaml"), std::string::npos) << m;
    EXPECT_NE(m.find("a parallel section"), std::string::npos) << m;
    EXPECT_NE(m.find("not supported"), std::string::npos) << m;
    EXPECT_NE(m.find("parallel.ep=3"), std::string::npos) << m;
    EXPECT_NE(m.find("parallel.dp=4"), std::string::npos) << m;
    EXPECT_NE(m.find("does not divide"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir / "out")) << "refused before the run directory is made";
  fs::remove_all(dir);
}
