// Sharded checkpoints reshard both ways, end to end through the CLI (issue 10 part 6):
//  - saved by `mpirun -np 4 trex train` at pp=2,dp=2,ep=2, consolidated into one process: every tensor (weights
//    and optimiser state) matches the one-process run of the same steps, and the one-process trainer resumes
//    from the sharded checkpoint with the losses of the uninterrupted one-process run;
//  - saved by one process, resumed at dp=2 / dp=2,ep=2 / pp=2 (np 2): the continued losses equal the
//    one-process continuation;
//  - `trex export-hf` of the sharded run writes the same bytes as the export of its consolidated checkpoint,
//    and agrees with the one-process run's export; it writes exactly the bytes saving the whole state at once writes
//    (save_state_dict), loads back through the checkpoint reader, and reports a host high-water of at most one
//    output tensor plus one fp32 tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/config.h"
#include "train/dsv4_trainable.h"
#include "train/sharded_checkpoint.h"
#include "train/cli_test_util.h"
#include "train/metrics.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using trex::testing::mpirun;
using trex::testing::sh;
using trex::testing::tiny_cli_model;

struct CliSetup {
  fs::path dir = fs::temp_directory_path() / ("trex_sharded_cli_" + std::to_string(::getpid()));
  std::string bin = TREX_BINARY;
  std::string error;
  CliSetup() {
    fs::remove_all(dir);
    fs::create_directories(dir);
    error = trex::testing::prepare_tiny_corpus(dir, bin);
  }
  ~CliSetup() { fs::remove_all(dir); }

  // 4 steps of 4 micro-batches of 2 rows; a checkpoint every step.
  fs::path config(const std::string& name, const json& parallel) const {
    json c = {{"seed", 7},
              {"model", {{"type", "dsv4"}, {"dsv4", tiny_cli_model(300)}}},
              {"data", {{"shards", (dir / "shards").string()}, {"tokenizer", (dir / "tok.json").string()},
                        {"seq_len", 32}, {"batch_size", 2}, {"grad_accum", 4}}},
              {"optimizer", {{"kind", "muon"}}},
              {"schedule", {{"lr", 0.003}, {"min_lr", 0.0003}, {"warmup_steps", 1}}},
              {"train", {{"max_steps", 4}}},
              {"checkpoint", {{"every", 1}, {"keep_last", 4}}},
              {"logging", {{"plot", false}}}};
    if (!parallel.is_null()) c["parallel"] = parallel;
    const fs::path p = dir / (name + ".json");
    std::ofstream(p) << c.dump(2);
    return p;
  }
  // `trex train` (under mpirun when np > 0) into `run`, which may hold a checkpoint to resume from.
  bool train(const fs::path& cfg, const fs::path& run, int np, int64_t max_steps, std::string* out) const {
    std::string cmd = (np > 0 ? mpirun(np) : std::string()) + bin + " train " + cfg.string() + " --out " +
                      run.string() + " --no-progress";
    if (max_steps > 0) cmd += " --max-steps " + std::to_string(max_steps);
    return sh(cmd, out) == 0;
  }
  std::vector<double> losses(const fs::path& run) const {
    std::vector<double> l;
    for (const auto& j : trex::train::read_jsonl(run / "metrics.jsonl")) l.push_back(j["loss"].get<double>());
    return l;
  }
};

CliSetup& setup() {
  static CliSetup s;
  return s;
}

// The one-process reference run of 4 steps (shared by the tests).
const fs::path& reference_run() {
  static fs::path run;
  if (run.empty()) {
    CliSetup& s = setup();
    std::string out;
    run = s.dir / "run_ref";
    if (!s.train(s.config("ref", json()), run, 0, -1, &out)) ADD_FAILURE() << out;
  }
  return run;
}

void expect_same_losses(const std::vector<double>& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(got[i], ref[i], 1e-5 * std::abs(ref[i])) << what << ": step " << i + 1;
}

// Every tensor of `got` is in `ref` and vice versa, integer tables exactly; float tensors agree to `rel` of the
// tensor's largest value, except where Adam-style normalisation turned reduction-order noise of near-zero
// gradients into whole update steps: those may differ by at most `abs_cap` (a few lr steps), and they must be
// rare (at most 5% of the tensors).
void expect_close_files(const fs::path& got, const fs::path& ref, double rel, double abs_cap, const std::string& what) {
  trex::ckpt::SafetensorsReader g(got), r(ref);
  ASSERT_EQ(g.names(), r.names()) << what;
  size_t loose = 0, n_float = 0;
  for (const auto& name : r.names()) {
    trex::TensorView a = g.view(name), b = r.view(name);
    ASSERT_EQ(a.shape, b.shape) << what << " " << name;
    ASSERT_EQ(a.dtype, b.dtype) << what << " " << name;
    if (a.dtype != trex::DType::F32) {  // integer tables (tid2eid): exact
      EXPECT_EQ(0, std::memcmp(a.data, b.data, a.nbytes())) << what << " " << name;
      continue;
    }
    ++n_float;
    const float* x = static_cast<const float*>(a.data);
    const float* y = static_cast<const float*>(b.data);
    double scale = 0, dmax = 0;
    for (int64_t i = 0; i < trex::numel(a.shape); ++i) {
      scale = std::max(scale, double(std::abs(y[i])));
      dmax = std::max(dmax, std::abs(double(x[i]) - double(y[i])));
    }
    if (std::getenv("TREX_TEST_VERBOSE")) std::printf("%-50s scale %.3e maxdiff %.3e\n", name.c_str(), scale, dmax);
    if (dmax <= rel * std::max(scale, 1e-12)) continue;
    ++loose;
    EXPECT_LE(dmax, abs_cap) << what << ": " << name << " (largest value " << scale << ")";
  }
  EXPECT_LE(double(loose), 0.05 * double(n_float)) << what << ": " << loose << " of " << n_float
                                                    << " tensors beyond the relative tolerance";
}

bool have_mpirun() {
  std::string out;
  return sh("command -v mpirun", &out) == 0;
}

}  // namespace

TEST(ShardedCheckpointCli, SavedAtPp2Dp2Ep2LoadsInOneProcess) {
  CliSetup& s = setup();
  ASSERT_TRUE(s.error.empty()) << s.error;
  ASSERT_TRUE(have_mpirun());
  const fs::path ref = reference_run();
  const std::vector<double> ref_losses = s.losses(ref);
  ASSERT_EQ(ref_losses.size(), 4u);
  std::string out;
  const fs::path run = s.dir / "run_pp2dp2ep2";
  ASSERT_TRUE(s.train(s.config("pp2dp2ep2", {{"pp", 2}, {"dp", 2}, {"ep", 2}}), run, 4, 3, &out)) << out;
  const fs::path step3 = run / "checkpoints" / "step_00000003";
  ASSERT_TRUE(fs::exists(step3 / "manifest.json")) << out;
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(fs::exists(step3 / ("rank-" + std::to_string(r) + ".safetensors"))) << r;

  // Consolidated into one process: every weight and optimiser tensor of the one-process run at step 3.
  ASSERT_EQ(sh(s.bin + " ckpt consolidate " + step3.string() + " --out " + (s.dir / "cons").string(), &out), 0) << out;
  const fs::path cons = s.dir / "cons" / "step_00000003";
  expect_close_files(cons / "model.safetensors", ref / "checkpoints" / "step_00000003" / "model.safetensors", 1e-4,
                     3 * 0.003, "weights");
  expect_close_files(cons / "optimizer.safetensors", ref / "checkpoints" / "step_00000003" / "optimizer.safetensors",
                     1e-3, 1e-3, "optimiser state");

  // The one-process trainer resumes from the sharded checkpoint: step 4 as in the uninterrupted run.
  const fs::path one = s.dir / "run_pp2dp2ep2_then_one";
  fs::copy(run, one, fs::copy_options::recursive);
  ASSERT_TRUE(s.train(s.config("ref", json()), one, 0, -1, &out)) << out;
  EXPECT_NE(out.find("\"resumed\": true"), std::string::npos) << out;
  expect_same_losses(s.losses(one), ref_losses, "pp=2,dp=2,ep=2 for 3 steps, then one process");
}

TEST(ShardedCheckpointCli, SavedByOneProcessContinuesInOtherLayouts) {
  CliSetup& s = setup();
  ASSERT_TRUE(s.error.empty()) << s.error;
  ASSERT_TRUE(have_mpirun());
  const std::vector<double> ref_losses = s.losses(reference_run());
  ASSERT_EQ(ref_losses.size(), 4u);
  EXPECT_NE(ref_losses[1], ref_losses[3]);  // the run trains, or equal losses would prove little
  std::string out;
  const fs::path half = s.dir / "run_half";
  ASSERT_TRUE(s.train(s.config("ref", json()), half, 0, 2, &out)) << out;
  struct Layout {
    std::string name;
    json parallel;
  };
  for (const Layout& l : {Layout{"dp2", {{"dp", 2}}}, Layout{"dp2ep2", {{"dp", 2}, {"ep", 2}}},
                          Layout{"pp2", {{"pp", 2}}}}) {
    const fs::path run = s.dir / ("run_half_then_" + l.name);
    fs::copy(half, run, fs::copy_options::recursive);
    ASSERT_TRUE(s.train(s.config(l.name, l.parallel), run, 2, -1, &out)) << out;
    EXPECT_NE(out.find("\"resumed\": true"), std::string::npos) << out;
    expect_same_losses(s.losses(run), ref_losses, "one process for 2 steps, then " + l.name);
    EXPECT_TRUE(fs::exists(run / "checkpoints" / "step_00000004" / "manifest.json")) << l.name;
  }
}

TEST(ShardedCheckpointCli, HfExportFromAShardedRun) {
  CliSetup& s = setup();
  ASSERT_TRUE(s.error.empty()) << s.error;
  ASSERT_TRUE(have_mpirun());
  const fs::path ref = reference_run();
  std::string out;
  const fs::path run = s.dir / "run_export_dp2ep2";
  ASSERT_TRUE(s.train(s.config("export_dp2ep2", {{"dp", 2}, {"ep", 2}}), run, 2, -1, &out)) << out;
  ASSERT_TRUE(fs::exists(run / "checkpoints" / "step_00000004" / "manifest.json"));
  ASSERT_EQ(sh(s.bin + " export-hf " + run.string() + " --dtype f32 --out " + (s.dir / "hf_sharded").string(), &out), 0)
      << out;
  // The streamed export reports its host memory: one output tensor's buffer plus one fp32 tensor at most, far
  // below the model.
  {
    const json rep = json::parse(out.substr(out.rfind("{\"checkpoint\"")));
    const trex::ckpt::SafetensorsReader hf(s.dir / "hf_sharded");
    size_t largest = 0;
    for (const auto& n : hf.names()) largest = std::max(largest, hf.entry(n).nbytes());
    const int64_t peak = rep.at("host_peak_bytes").get<int64_t>();
    EXPECT_GT(peak, 0) << out;
    EXPECT_LE(peak, int64_t(2 * largest)) << out;
    EXPECT_LT(peak, int64_t(hf.total_bytes())) << out;
    EXPECT_EQ(rep.at("bytes").get<int64_t>(), int64_t(hf.total_bytes())) << out;
  }
  // The old path: the whole state assembled in this process and saved at once (save_state_dict) writes the same
  // bytes, tensor by tensor, and the export loads back through the checkpoint reader.
  {
    const trex::dsv4::ModelConfig mc = trex::dsv4::parse_model_config(tiny_cli_model(300), "tiny_cli_model");
    const trex::train::CheckpointReader r(run / "checkpoints" / "step_00000004");
    trex::train::Dsv4Trainable seeded(mc, {}, 7);  // the run's seed: its hash-routing tables
    trex::dsv4::StateDict whole;
    for (const trex::dsv4::ExpectedTensor& e : trex::dsv4::expected_tensors(mc)) {
      trex::HostTensor t(e.dtype, e.shape);
      if (e.dtype == trex::DType::I64) {
        const std::vector<int32_t>& table = seeded.model().params().tid2eid.at(e.name);
        for (size_t i = 0; i < table.size(); ++i) t.view.as<int64_t>()[i] = table[i];
      } else {
        r.read_param(e.name, e.shape, t.f32());
      }
      whole.emplace(e.name, std::move(t));
    }
    trex::dsv4::save_state_dict(s.dir / "hf_whole", whole, mc, trex::dsv4::Dialect::Transformers, trex::DType::F32);
    const trex::ckpt::SafetensorsReader x(s.dir / "hf_sharded"), w(s.dir / "hf_whole");
    ASSERT_EQ(x.names(), w.names());
    for (const auto& name : x.names()) {
      const trex::TensorView u = x.view(name), v = w.view(name);
      ASSERT_EQ(u.dtype, v.dtype) << name;
      ASSERT_EQ(u.shape, v.shape) << name;
      EXPECT_EQ(0, std::memcmp(u.data, v.data, u.nbytes())) << name << ": streamed and whole-state bytes differ";
    }
    const trex::dsv4::ModelConfig back = trex::dsv4::load_model_config(s.dir / "hf_sharded" / "config.json");
    const trex::dsv4::StateDict loaded = trex::dsv4::load_state_dict(s.dir / "hf_sharded", back);
    ASSERT_EQ(loaded.size(), whole.size());
    for (const auto& [name, t] : whole)
      EXPECT_EQ(0, std::memcmp(loaded.at(name).view.data, t.view.data, t.view.nbytes())) << name << " reloaded";
  }
  // The same checkpoint consolidated into a run directory of its own, exported: byte-equal tensors.
  const fs::path cons_run = s.dir / "run_export_consolidated";
  fs::create_directories(cons_run);
  fs::copy_file(run / "config.json", cons_run / "config.json");
  ASSERT_EQ(sh(s.bin + " ckpt consolidate " + (run / "checkpoints" / "step_00000004").string() + " --out " +
                   (cons_run / "checkpoints").string(), &out), 0) << out;
  ASSERT_EQ(sh(s.bin + " export-hf " + cons_run.string() + " --dtype f32 --out " + (s.dir / "hf_cons").string(), &out),
            0) << out;
  trex::ckpt::SafetensorsReader a(s.dir / "hf_sharded"), b(s.dir / "hf_cons");
  ASSERT_EQ(a.names(), b.names());
  ASSERT_GT(a.size(), 10u);
  for (const auto& name : a.names()) {
    trex::TensorView x = a.view(name), y = b.view(name);
    ASSERT_EQ(x.nbytes(), y.nbytes()) << name;
    EXPECT_EQ(0, std::memcmp(x.data, y.data, x.nbytes())) << name;
  }
  // And the one-process run's export agrees up to reduction-order noise.
  ASSERT_EQ(sh(s.bin + " export-hf " + ref.string() + " --dtype f32 --out " + (s.dir / "hf_ref").string(), &out), 0)
      << out;
  expect_close_files(s.dir / "hf_sharded", s.dir / "hf_ref", 1e-4, 4 * 0.003, "HF export, dp=2,ep=2 vs one process");
}
