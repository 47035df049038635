// GpuModel::load_checkpoint (a rank's tensors streamed from the checkpoint files, one at a time) against the load
// through a full CPU model (load_state_dict -> Model -> GpuModel::load_from): every parameter's fp32 master and
// every router bias identical, on the golden fixtures, a sharded copy, and the demo's export when present (its MTP
// tensors are in the file, not in the GPU model); a pipeline stage loads only its own layers; a missing tensor is
// an error naming it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>

#include "ckpt/safetensors.h"
#include "core/files.h"
#include "model/cuda/gpu_model.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/model.h"

namespace {

namespace fs = std::filesystem;
using trex::dsv4gpu::GpuModel;
using trex::dsv4gpu::GpuModelOptions;

trex::dsv4::ModelConfig main_config(const fs::path& dir) {
  trex::dsv4::ModelConfig cfg = trex::dsv4::load_model_config(dir / "config.json");
  cfg.n_mtp = 0;  // the GPU training model has no MTP block
  return cfg;
}

void expect_same_load(const fs::path& dir, const GpuModelOptions& opts) {
  if (!fs::exists(dir / "config.json")) {
    std::printf("not found, not checked: %s\n", dir.c_str());
    return;
  }
  const trex::dsv4::ModelConfig cfg = main_config(dir);
  trex::dsv4::LoadOptions lo;
  lo.filter = [](const std::string& n) { return n.rfind("mtp.", 0) != 0; };
  trex::dsv4::Model<float> cpu(cfg);
  cpu.load(trex::dsv4::load_state_dict(dir, cfg, lo));
  GpuModel via_cpu(cfg, opts), streamed(cfg, opts);
  via_cpu.load_from(cpu.params());
  streamed.init_random(99);  // every value must be overwritten by the load
  const GpuModel::LoadStats st = streamed.load_checkpoint(trex::dsv4::CheckpointReader(dir));
  const std::vector<std::string> names = streamed.param_names();
  ASSERT_FALSE(names.empty());
  int64_t hash_tables = 0;
  for (int64_t l = opts.layer_begin; l < (opts.layer_end < 0 ? cfg.n_layers : opts.layer_end); ++l)
    hash_tables += l < cfg.n_hash_layers();
  EXPECT_EQ(st.tensors, int64_t(names.size() + streamed.router_bias_names().size()) + hash_tables);
  for (const std::string& n : names) {
    ASSERT_EQ(streamed.value(n), via_cpu.value(n)) << n;
  }
  for (const std::string& n : streamed.router_bias_names()) EXPECT_EQ(streamed.router_bias(n), via_cpu.router_bias(n)) << n;
  EXPECT_GT(st.bytes, 0);
  EXPECT_GT(st.largest_tensor_bytes, 0);
  EXPECT_LE(st.largest_tensor_bytes, st.bytes);
  std::printf("%s: %lld tensors, %.2f MB in %.3f s, host staging peak %.2f MB\n", dir.filename().c_str(),
              (long long)st.tensors, double(st.bytes) / 1e6, st.seconds, double(st.largest_tensor_bytes) / 1e6);
}

TEST(GpuCheckpointLoad, StreamedEqualsLoadThroughCpuModelOnFixtures) {
  for (const fs::path& dir : {trex::shared_dir() / "fixtures" / "deepseek-v4" / "tiny",
                              trex::source_dir() / "tests/fixtures/deepseek-v4/v4-tiny-b",
                              trex::source_dir() / "tests/fixtures/deepseek-v4/v4-tiny-c",
                              trex::source_dir() / ".devdeps/demo-hf", trex::source_dir() / "demo/hf"}) {
    SCOPED_TRACE(dir.string());
    expect_same_load(dir, {});
  }
}

TEST(GpuCheckpointLoad, PipelineStageLoadsOnlyItsLayers) {
  const fs::path dir = trex::source_dir() / "tests/fixtures/deepseek-v4/v4-tiny-b";
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << "not found: " << dir;
  const trex::dsv4::ModelConfig cfg = main_config(dir);
  ASSERT_GE(cfg.n_layers, 2);
  GpuModelOptions o;
  o.layer_begin = 1;
  expect_same_load(dir, o);
  GpuModel stage(cfg, o);
  for (const std::string& n : stage.param_names()) EXPECT_EQ(n.rfind("layers.0.", 0), std::string::npos) << n;
}

// A copy of the checkpoint in `dst`, in shards of at most shard_bytes, without the stored tensors `skip` names.
void copy_checkpoint(const fs::path& src, const fs::path& dst, size_t shard_bytes,
                     const std::function<bool(const std::string&)>& skip) {
  fs::remove_all(dst);
  fs::create_directories(dst);
  fs::copy_file(src / "config.json", dst / "config.json");
  const trex::ckpt::SafetensorsReader r(src / "model.safetensors");
  std::vector<trex::ckpt::TensorToWrite> out;
  for (const std::string& n : r.names()) {
    if (skip(n)) continue;
    const trex::TensorView v = r.view(n);
    out.push_back({n, v.dtype, v.shape, v.data, {}});
  }
  trex::ckpt::write_safetensors_sharded(dst, out, shard_bytes);
}

TEST(GpuCheckpointLoad, ShardedCopyLoadsTheSameAndAMissingTensorIsNamed) {
  const fs::path src = trex::source_dir() / "tests/fixtures/deepseek-v4/v4-tiny-b";
  if (!fs::exists(src / "config.json")) GTEST_SKIP() << "not found: " << src;
  const fs::path tmp = fs::temp_directory_path() / fmt::format("trex_gpu_load_{}", ::getpid());
  copy_checkpoint(src, tmp / "sharded", 64 << 10, [](const std::string&) { return false; });
  ASSERT_TRUE(fs::exists(tmp / "sharded" / "model.safetensors.index.json"));
  expect_same_load(tmp / "sharded", {});
  // Without one of layer 1's tensors the load stops with an error naming layer 1's tensor.
  std::string dropped;
  copy_checkpoint(src, tmp / "missing", 64 << 10, [&](const std::string& n) {
    if (dropped.empty() && n.find("layers.1.") != std::string::npos && n.find("norm") != std::string::npos) {
      dropped = n;
      return true;
    }
    return false;
  });
  ASSERT_FALSE(dropped.empty());
  GpuModel m(main_config(src));
  try {
    m.load_checkpoint(trex::dsv4::CheckpointReader(tmp / "missing"));
    ADD_FAILURE() << "a checkpoint without " << dropped << " loaded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1."), std::string::npos) << e.what();
  }
  fs::remove_all(tmp);
}

}  // namespace
