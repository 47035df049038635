// `trex train --device cuda` on two GPUs under mpirun (the GPU mesh engine through the CLI): dp=2 (ZeRO-1, two
// micro-batches per rank: accumulation across the in-place reduce-scatters) gives the one-GPU run's per-step
// losses and target counts for the same global batch (the mean of micro-batch means is exact; only bf16 rounding
// and reduction order differ; ep is refused by the config check until experts are written by their owners), and a
// dp=2 run stopped at step 2 resumes on one
// GPU from its sharded checkpoint. Skipped with fewer than 2 visible GPUs (NCCL refuses two ranks on one device).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "train/cli_test_util.h"
#include "train/metrics.h"
#include "train/tiny_gpu_config.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using trex::testing::mpirun;
using trex::testing::sh;

namespace {

struct Dir {
  fs::path dir = fs::temp_directory_path() / ("trex_gpu_mesh_cli_" + std::to_string(::getpid()));
  std::string bin = TREX_BINARY;
  Dir() {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~Dir() { fs::remove_all(dir); }
  std::string prepare() {
    {
      std::ofstream f(dir / "c.jsonl");
      for (int i = 0; i < 80; ++i)
        f << json{{"text", "route " + std::to_string(i % 5) + " tokens to expert " + std::to_string(i % 3) +
                               " of the mesh, then " + std::to_string(i % 7) + " more. "}}
                 .dump()
          << "\n";
    }
    std::string out;
    if (sh(bin + " tokenizer train --input " + (dir / "c.jsonl").string() + " --vocab-size 300 --out " +
               (dir / "tok.json").string(), &out) != 0 ||
        sh(bin + " data prepare --tokenizer " + (dir / "tok.json").string() + " --input " +
               (dir / "c.jsonl").string() + " --seq-len 64 --out " + (dir / "shards").string(), &out) != 0)
      return out;
    return "";
  }
  fs::path config(const std::string& name, const json& parallel) const {
    json model = trex::testing::tiny_gpu_config_json();
    model["vocab_size"] = 320;
    json c = {{"seed", 5},
              {"model", {{"type", "dsv4"}, {"dsv4", model}, {"use_mtp", false}, {"balance_alpha", 0.0}}},
              {"data", {{"shards", (dir / "shards").string()}, {"tokenizer", (dir / "tok.json").string()},
                        {"seq_len", 64}, {"batch_size", 2}, {"grad_accum", 4}}},
              {"optimizer", {{"kind", "adamw"}, {"clip_grad_norm", 1.0}}},
              {"schedule", {{"lr", 0.003}, {"min_lr", 0.0003}, {"warmup_steps", 1}}},
              {"train", {{"max_steps", 3}}},
              {"checkpoint", {{"every", 2}, {"keep_last", 2}}},
              {"logging", {{"plot", false}}}};
    if (!parallel.is_null()) c["parallel"] = parallel;
    const fs::path p = dir / (name + ".json");
    std::ofstream(p) << c.dump(2);
    return p;
  }
  // Trains into `run` (under mpirun when np > 0); the exit status, the output in *out.
  int train(const fs::path& cfg, const fs::path& run, int np, const std::string& extra, std::string* out) const {
    const std::string cmd = (np > 0 ? mpirun(np) : std::string()) + bin + " train " + cfg.string() + " --out " +
                            run.string() + " --device cuda --no-progress" + extra;
    const int rc = sh(cmd, out);
    if (rc != 0) *out = "exit " + std::to_string(rc) + " from: " + cmd + "\n" + *out;
    return rc;
  }
};

std::vector<json> metrics(const fs::path& run) { return trex::train::read_jsonl(run / "metrics.jsonl"); }

}  // namespace

TEST(GpuMeshCli, DataAndExpertParallelFollowTheOneGpuRunAndResumeOnOneGpu) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 2)
    GTEST_SKIP() << "needs 2 GPUs (NCCL refuses two ranks on one device); " << n_dev << " visible";
  Dir d;
  const std::string err = d.prepare();
  ASSERT_EQ(err, "") << err;
  std::string out;
  const fs::path one = d.dir / "one";
  ASSERT_EQ(d.train(d.config("one", json()), one, 0, "", &out), 0) << out;
  const auto m1 = metrics(one);
  ASSERT_EQ(m1.size(), 3u);
  for (const auto& [name, par] : {std::pair<std::string, json>{"dp2", {{"dp", 2}}}}) {
    const fs::path run = d.dir / name;
    ASSERT_EQ(d.train(d.config(name, par), run, 2, "", &out), 0) << out;
    const auto m = metrics(run);
    ASSERT_EQ(m.size(), 3u) << name;
    for (size_t i = 0; i < 3; ++i) {
      const double a = m1[i]["loss"].get<double>(), b = m[i]["loss"].get<double>();
      std::printf("  %s step %zu: loss one GPU %.6f, two GPUs %.6f\n", name.c_str(), i + 1, a, b);
      EXPECT_LT(std::abs(a - b) / a, 5e-3) << name << " step " << i + 1;
      EXPECT_EQ(m1[i]["targets"], m[i]["targets"]) << name << " step " << i + 1 << ": the data order differs";
    }
    EXPECT_TRUE(fs::exists(run / "checkpoints" / "step_00000003" / "manifest.json")) << name;
  }
  // dp=2 stopped after step 2 (sharded checkpoint), continued on one GPU without the parallel section.
  const fs::path resumed = d.dir / "resumed";
  ASSERT_EQ(d.train(d.config("dp2", {{"dp", 2}}), resumed, 2, " --max-steps 2", &out), 0) << out;
  ASSERT_TRUE(fs::exists(resumed / "checkpoints" / "step_00000002" / "manifest.json"));
  ASSERT_EQ(d.train(d.config("one", json()), resumed, 0, "", &out), 0) << out;
  const auto mr = metrics(resumed);
  ASSERT_EQ(mr.size(), 3u);
  const double a = m1[2]["loss"].get<double>(), b = mr[2]["loss"].get<double>();
  EXPECT_LT(std::abs(a - b) / a, 5e-3) << "step 3 on one GPU after dp=2: " << b << " vs " << a;
}
