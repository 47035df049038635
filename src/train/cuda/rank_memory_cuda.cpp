#include "train/cuda/rank_memory.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>

#include "core/error.h"
#include "core/host_memory.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/lm_head_ce.h"
#include "model/dsv4/seq_layout.h"
#include "train/cuda/emulated_rank.h"

namespace trex::train {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
double gib(int64_t b) { return double(b) / kGiB; }
}  // namespace

RankMemory count_rank_memory(const dsv4::ModelConfig& cfg, const parallel::RankPartition& p, int64_t seq,
                             const dsv4gpu::GpuModelOptions& base) {
  TREX_CHECK(seq >= 1 && p.micro_batch_seqs >= 1, "rank {}: counting memory for micro-batches of {} x {} tokens",
             p.world_rank, p.micro_batch_seqs, seq);
  RankMemory r;
  // The footprint reads the groups' sizes and ranks only: emulated groups of the layout's sizes stand in for the
  // rank's real ones (which may not exist yet), so nothing is split off and nothing is allocated.
  parallel::EmulatedMesh sizing = parallel::make_emulated_mesh(p, comm::EmulatedGroup::Payload::CountOnly);
  for (int c = 0; c < int(p.chunks.size()); ++c) {
    const dsv4gpu::GpuModel::Footprint f =
        dsv4gpu::GpuModel::footprint(cfg, EmulatedRank::model_options(p, sizing, base, c));
    r.params.arena_elems += f.arena_elems, r.params.region_x_elems += f.region_x_elems;
    r.params.weight_elems += f.weight_elems, r.params.grad_elems += f.grad_elems;
    r.params.shard_elems += f.shard_elems, r.params.n_params += f.n_params;
    r.params.grad_buffer_bytes += f.grad_buffer_bytes, r.params.weight_buffer_bytes += f.weight_buffer_bytes;
    r.params.gradients = f.gradients;
  }
  const dsv4::SeqLayout mb = dsv4::SeqLayout::unpacked(p.micro_batch_seqs, seq);
  const int64_t N = mb.B * mb.T;
  for (const parallel::RankChunk& c : p.chunks) {
    dsv4gpu::ActivationPlanShape sh;
    sh.layer_begin = c.layer_begin, sh.layer_end = c.layer_end, sh.mtp = c.head && p.mtp;
    sh.recompute = base.recompute;
    sh.recompute_full_layers = base.recompute_full_layers;
    sh.head_grad = true;
    sh.balance = base.balance_alpha > 0, sh.balance_hash_layers = base.balance_hash_layers;
    sh.tp = p.spec.tp, sh.ep = p.spec.ep, sh.etp = p.spec.etp;
    r.plans.push_back(dsv4gpu::plan_activations(cfg, mb, sh));
    r.held.push_back(std::min<int64_t>(c.slots, p.micro_batches));
    r.activations += r.held.back() * r.plans.back().kept() + r.plans.back().block_scratch;
    r.chunk_layer_begin.push_back(c.layer_begin), r.chunk_layer_end.push_back(c.layer_end);
  }
  dsv4gpu::WorkspaceShape ws;
  ws.tokens = N, ws.chunks = int64_t(p.chunks.size()), ws.embeds = p.embed, ws.stages = p.spec.pp > 1;
  ws.act_in = !p.embed || p.spec.vpp > 1, ws.grad_in = !p.head || p.spec.vpp > 1;
  ws.etp = p.spec.etp;
  r.workspace = dsv4gpu::plan_workspace(cfg, ws);
  if (p.head) {
    const cuda::LmHeadCeShape s{N, cfg.hidden, cfg.vocab_size, std::min(base.lm_chunk, cfg.vocab_size), base.lm_rows,
                                base.lm_grad_rows};
    r.lm_head = int64_t(cuda::lm_head_ce_fwd_grad_scratch_bytes(s));
  }
  return r;
}

std::string RankMemory::describe() const {
  std::string per_chunk;
  for (size_t c = 0; c < plans.size(); ++c) {
    const dsv4gpu::ActivationPlan& pl = plans[c];
    std::string per_layer;
    for (size_t i = 0; i < pl.blocks.size(); ++i)
      per_layer += fmt::format("{}{}: {:.2f}", i ? ", " : "", chunk_layer_begin[c] + int64_t(i), gib(pl.blocks[i].kept));
    per_chunk += fmt::format("{}layers [{}, {}): {} micro-batches x {:.2f} (streams {:.2f}, head {:.2f}, layers {}) "
                             "+ recomputation scratch {:.2f}",
                             c ? "; " : "", chunk_layer_begin[c], chunk_layer_end[c], held[c], gib(pl.kept()),
                             gib(pl.streams), gib(pl.heads), per_layer, gib(pl.block_scratch));
  }
  return fmt::format(
      "{:.2f} GiB: bf16 weights {:.2f}, fp32 gradients {:.2f}, fp32 master shard {:.2f}, optimiser moments {:.2f} "
      "({} parameters); activations {:.2f} ({}); workspace {:.2f} (gradient streams {:.2f}, pipeline boundary "
      "{:.2f}, LM head {:.2f}, MoE backward {:.2f}); bucket buffers {:.2f} (ZeRO-2 gradients {:.2f}, ZeRO-3 gathers "
      "{:.2f}){}",
      gib(total()), gib(params.compute_bytes()), gib(params.grad_bytes()), gib(params.master_bytes()),
      gib(params.adamw_bytes()), params.n_params, gib(activations), per_chunk, gib(workspaces()),
      gib(workspace.grad_streams), gib(workspace.boundary), gib(lm_head), gib(workspace.moe_bwd), gib(bucket_buffers()),
      gib(params.grad_buffer_bytes), gib(params.weight_buffer_bytes),
      accumulation ? fmt::format("; gradient accumulation shard {:.2f}", gib(accumulation)) : std::string());
}

std::string device_memory_refusal(const std::vector<DeviceClaim>& claims, int rank, const std::string& mine) {
  TREX_CHECK(rank >= 0 && rank < int(claims.size()), "device memory check: rank {} of {} claims", rank,
             claims.size());
  const auto with_mine = [&](int r) { return r == rank ? fmt::format(". Rank {}'s count: {}", rank, mine) : ""; };
  for (int r = 0; r < int(claims.size()); ++r) {
    const DeviceClaim& c = claims[size_t(r)];
    if (c.limit > 0 && c.need > c.limit)
      return fmt::format("rank {} does not fit: it counts {:.2f} GiB before allocating, over train.device_memory_gib "
                         "{:.2f}{}",
                         r, gib(c.need), gib(c.limit), with_mine(r));
  }
  std::map<std::array<uint8_t, 16>, std::vector<int>> by_device;
  for (int r = 0; r < int(claims.size()); ++r) by_device[claims[size_t(r)].device].push_back(r);
  // In rank order of each device's first rank, so every rank names the same device.
  std::vector<std::vector<int>> devices;
  for (auto& [uuid, ranks] : by_device) devices.push_back(ranks);
  std::sort(devices.begin(), devices.end());
  for (const std::vector<int>& ranks : devices) {
    int64_t need = 0, free = claims[size_t(ranks[0])].free;
    for (int r : ranks) need += claims[size_t(r)].need, free = std::min(free, claims[size_t(r)].free);
    if (need < free) continue;
    const DeviceClaim& first = claims[size_t(ranks[0])];
    std::string who;
    for (int r : ranks)
      who += fmt::format("{}rank {} {:.2f}", who.empty() ? "" : ", ", r, gib(claims[size_t(r)].need));
    const bool me = std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
    return fmt::format("does not fit: {} on CUDA device {} (of rank {}) count {:.2f} GiB before allocating ({}), and "
                       "the device has {:.2f} GiB free of {:.2f}{}",
                       ranks.size() == 1 ? fmt::format("rank {}", ranks[0]) : fmt::format("{} ranks", ranks.size()),
                       first.ordinal, ranks[0], gib(need), who, gib(free), gib(first.total),
                       me ? with_mine(rank) : std::string());
  }
  std::map<uint64_t, std::vector<int>> by_host;
  for (int r = 0; r < int(claims.size()); ++r) by_host[claims[size_t(r)].host].push_back(r);
  std::vector<std::vector<int>> hosts;
  for (auto& [h, ranks] : by_host) hosts.push_back(ranks);
  std::sort(hosts.begin(), hosts.end());
  for (const std::vector<int>& ranks : hosts) {
    int64_t need = 0, avail = -1;
    for (int r : ranks) {
      const DeviceClaim& c = claims[size_t(r)];
      need += c.host_need;
      if (c.host_free >= 0) avail = avail < 0 ? c.host_free : std::min(avail, c.host_free);
    }
    if (need == 0 || avail < 0 || need < avail) continue;
    return fmt::format("does not fit on the host: without model.init_from each rank first builds the whole model's "
                       "seeded init in fp32 with its gradients on the host ({:.2f} GiB per rank), and the {} of the "
                       "host of rank {} need {:.2f} GiB together where it has {:.2f} GiB available. Start from a "
                       "checkpoint (model.init_from: each rank reads only its partition, straight to the GPU)",
                       gib(claims[size_t(ranks[0])].host_need),
                       ranks.size() == 1 ? std::string("rank") : fmt::format("{} ranks", ranks.size()), ranks[0],
                       gib(need), gib(avail));
  }
  return {};
}

DeviceClaim claim_device_memory(int64_t need, double limit_gib, int64_t host_need) {
  DeviceClaim c;
  TREX_CUDA(cudaGetDevice(&c.ordinal));
  cudaDeviceProp prop{};
  TREX_CUDA(cudaGetDeviceProperties(&prop, c.ordinal));
  std::copy(prop.uuid.bytes, prop.uuid.bytes + 16, reinterpret_cast<char*>(c.device.data()));
  size_t free_b = 0, total_b = 0;
  TREX_CUDA(cudaMemGetInfo(&free_b, &total_b));
  c.need = need, c.free = int64_t(free_b), c.total = int64_t(total_b);
  c.limit = int64_t(limit_gib * kGiB);
  c.host = uint64_t(std::hash<std::string>{}(host_name()));
  c.host_need = host_need;
  c.host_free = host_available_bytes();
  return c;
}

void check_device_memory(comm::Communicator& host, const DeviceClaim& mine, const std::string& who,
                         const std::string& my_count) {
  // Each claim as 10 int64: the UUID's two halves, ordinal, need, free, total, limit, host, host need, host free.
  constexpr int kWords = 10;
  auto pack = [](const DeviceClaim& c) {
    std::array<int64_t, kWords> w{};
    std::copy(c.device.begin(), c.device.end(), reinterpret_cast<uint8_t*>(w.data()));
    w[2] = c.ordinal, w[3] = c.need, w[4] = c.free, w[5] = c.total, w[6] = c.limit;
    w[7] = int64_t(c.host), w[8] = c.host_need, w[9] = c.host_free;
    return w;
  };
  const std::array<int64_t, kWords> send = pack(mine);
  std::vector<int64_t> recv(size_t(kWords) * size_t(host.size()));
  host.all_gather(send.data(), recv.data(), kWords, comm::ElemType::I64)->wait();
  std::vector<DeviceClaim> claims(size_t(host.size()));
  for (size_t r = 0; r < claims.size(); ++r) {
    const int64_t* w = recv.data() + r * kWords;
    DeviceClaim& c = claims[r];
    std::copy(reinterpret_cast<const uint8_t*>(w), reinterpret_cast<const uint8_t*>(w) + 16, c.device.begin());
    c.ordinal = int(w[2]), c.need = w[3], c.free = w[4], c.total = w[5], c.limit = w[6];
    c.host = uint64_t(w[7]), c.host_need = w[8], c.host_free = w[9];
  }
  const std::string why = device_memory_refusal(claims, host.rank(), my_count);
  TREX_CHECK(why.empty(), "{}: {}", who, why);
}

}  // namespace trex::train
