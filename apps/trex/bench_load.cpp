// `trex bench load`: writes (unless DIR holds one) a checkpoint of the first --layers layers of the config in the
// released format (FP8 128x128 blocks, MXFP4 experts, BF16 / F32 rest: model/dsv4/released_format.h; random codes),
// loads the emulated rank's part of it (its experts, its TP slices: the layout's dp / ep / tp at one stage holding
// those layers) onto this GPU through GpuModel::load_checkpoint, and prints one JSON line: seconds, bytes read,
// GB/s, the loader's host high-water, and the projected load time of the real rank (the same rank of the same
// layout on the whole model): its stored bytes, counted from the parameter table in the released dtypes, over the
// rate measured here. The projection assumes the measured read rate holds for the whole rank (a first read of a
// file straight from disk is slower than one from the page cache: run it twice to see both).
#include "bench_load.h"

#include <fmt/format.h>

#include <algorithm>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/config.h"
#include "model/dsv4/param_table.h"
#include "model/dsv4/released_format.h"
#include "parallel/mesh.h"
#include "parallel/rank_partition.h"
#ifdef TREX_HAVE_CUDA
#include "model/cuda/gpu_model.h"
#include "model/dsv4/checkpoint.h"
#include "train/cuda/emulated_rank.h"
#endif

namespace trex::bench {

namespace fs = std::filesystem;

namespace {

// The stored bytes of rank p's tensors (its stage's or chunks' layers, the embedding on the first stage, the head on the last,
// its experts, 1 / tp of each TP-split tensor) in the released format.
int64_t rank_stored_bytes(const dsv4::ModelConfig& cfg, const parallel::RankPartition& p, int64_t block) {
  int64_t n = 0;
  for (const dsv4::ParamSpec& s : dsv4::param_table(cfg)) {
    if (s.part == dsv4::ParamPart::Mtp) continue;
    if (s.part == dsv4::ParamPart::Layer &&
        std::none_of(p.chunks.begin(), p.chunks.end(), [&s](const parallel::RankChunk& c) {
          return s.layer >= c.layer_begin && s.layer < c.layer_end;
        }))
      continue;  // another stage's (with vpp: none of the rank's chunks)
    if (s.part == dsv4::ParamPart::Embed && !p.embed) continue;  // the first stage's
    if (s.part == dsv4::ParamPart::Head && !p.head) continue;    // the last stage's: head, final norm, hc_head
    if (s.expert >= 0 && (s.expert < p.expert_begin || s.expert >= p.expert_end)) continue;
    const int64_t b = dsv4::released_bytes(s.name, s.shape, s.kind == dsv4::ParamKind::HashTable ? DType::I64 : DType::F32, block);
    n += dsv4::tp_split_axis(s.name, dsv4::tp_experts_of(p.spec.etp)) >= 0 ? b / p.spec.tp : b;
  }
  return n;
}

}  // namespace

void bench_load(const LoadBenchArgs& a) {
  json full_json = read_json_file(a.config);
  full_json["num_nextn_predict_layers"] = 0;  // the GPU stages do not hold the MTP module
  const int64_t L_full = full_json.at("num_hidden_layers").get<int64_t>();
  TREX_CHECK(a.layers >= 1 && a.layers <= L_full, "bench load: --layers {} outside [1, {}]", a.layers, L_full);
  json cr = json::array();
  for (int64_t i = 0; i < L_full; ++i) cr.push_back(full_json.at("compress_ratios")[size_t(i)]);
  full_json["compress_ratios"] = cr;
  const dsv4::ModelConfig full = dsv4::parse_model_config(full_json, a.config);
  json small_json = full_json;
  small_json["num_hidden_layers"] = a.layers;
  json scr = json::array();
  for (int64_t i = 0; i < a.layers; ++i) scr.push_back(cr[size_t(i)]);
  small_json["compress_ratios"] = scr;
  small_json["num_hash_layers"] = std::min<int64_t>(full_json.value("num_hash_layers", int64_t(0)), a.layers);
  const dsv4::ModelConfig small = dsv4::parse_model_config(small_json, a.config + " (first layers)");

  // The real rank, and the rank of the same dp / ep / tp coordinates at one stage holding the written layers.
  const parallel::MeshSpec spec = parallel::parse_mesh_spec(a.layout);
  const int64_t dpn = int64_t(spec.dp);
  const parallel::RankPartition real = parallel::rank_partition(spec, a.rank, full, dpn);
  parallel::MeshSpec one_stage = spec;
  one_stage.pp = 1, one_stage.vpp = 1;
  const int small_rank = a.rank % (spec.dp * spec.tp);
  const parallel::RankPartition here = parallel::rank_partition(one_stage, small_rank, small, dpn);
  std::fprintf(stderr, "real rank: %s\nloaded here: %s\n", real.describe().c_str(), here.describe().c_str());
  const int64_t real_bytes = rank_stored_bytes(full, real, a.block);

  if (!fs::exists(fs::path(a.dir) / "config.json")) {
    int64_t total = 0;
    for (const dsv4::ParamSpec& s : dsv4::param_table(small))
      total += dsv4::released_bytes(s.name, s.shape, s.kind == dsv4::ParamKind::HashTable ? DType::I64 : DType::F32, a.block);
    std::fprintf(stderr, "writing %.2f GB (released format, %lld layers) into %s\n", double(total) / 1e9,
                 (long long)a.layers, a.dir.c_str());
    dsv4::write_random_released(a.dir, small, a.block, 1, size_t(5) << 30);
  }
#ifndef TREX_HAVE_CUDA
  (void)real_bytes;
  fail("bench load: this build has no CUDA backend (configure with -DTREX_CUDA=ON)");
#else
  parallel::EmulatedMesh mesh = parallel::make_emulated_mesh(here);
  dsv4gpu::GpuModelOptions base;
  base.gradients = false;  // the load fills the fp32 master and the bf16 compute copy
  const dsv4gpu::GpuModelOptions o = train::EmulatedRank::model_options(here, mesh, base);
  dsv4gpu::GpuModel m(small, o);
  const dsv4::CheckpointReader reader(a.dir);
  const dsv4gpu::GpuModel::LoadStats st = m.load_checkpoint(reader, size_t(a.staging_mb) << 20);
  const double gbs = double(st.stored_bytes) / 1e9 / std::max(st.seconds, 1e-9);
  json j;
  j["bench"] = "load";
  j["layout"] = a.layout;
  j["rank"] = a.rank;
  j["layers_loaded"] = a.layers;
  j["tensors"] = st.tensors;
  j["read_gb"] = double(st.stored_bytes) / 1e9;
  j["fp32_gb"] = double(st.bytes) / 1e9;
  j["seconds"] = st.seconds;
  j["read_gb_per_s"] = gbs;
  j["host_peak_mb"] = double(st.host_peak_bytes) / 1e6;
  j["rank_read_gb"] = double(real_bytes) / 1e9;
  j["projected_rank_seconds"] = double(real_bytes) / 1e9 / std::max(gbs, 1e-9);
  j["projection"] = "rank_read_gb (the real rank's tensors in the released dtypes) / read_gb_per_s (measured here)";
  std::printf("%s\n", j.dump().c_str());
#endif
}

}  // namespace trex::bench
