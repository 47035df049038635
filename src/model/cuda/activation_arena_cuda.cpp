// The activation arena's regions, their binding to the GPU model's pools, and the plan (activation_arena.h).
#include "model/cuda/activation_arena.h"

#include <map>

#include "model/cuda/cuda_backend.h"
#include "model/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

bool ActivationArena::overflowed() const {
  for (const auto& r : regions)
    if (r->overflows() > 0) return true;
  return false;
}

namespace {

// Every pool of the model's training step: the live batch state, each pipeline slot's parked state, the
// backend's forward / backward pools.
template <class F>
void for_each_pool(GpuModel::Impl& m, F&& f) {
  auto block = [&f](auto& b) { f(b.keep), f(b.redo), f(b.picks); };
  f(m.acts), f(m.out), f(m.grad_out);
  for (int64_t l = m.l0; l < m.l1; ++l) block(*m.blocks[size_t(l)]);
  if (m.mtp_block) block(*m.mtp_block);
  for (GpuModel::Impl::Slot& z : m.slots) {
    f(z.acts), f(z.out), f(z.grad_out);
    for (int64_t l = m.l0; l < m.l1; ++l) block(z.blocks[size_t(l)]);
    if (m.mtp_block) block(z.mtp);
  }
  for (Pool* p : m.backend->step_pools()) f(*p);
}

bool in_flight(const GpuModel::Impl& m) {
  for (const GpuModel::Impl::Slot& z : m.slots)
    if (z.forward_done) return true;
  return m.step_mode && m.forward_done;
}

}  // namespace

void activation_arena_bind(GpuModel::Impl& m) {
  auto a = std::make_unique<ActivationArena>();
  auto region = [&a](std::string name) {
    a->regions.push_back(std::make_shared<ArenaRegion>());
    a->names.push_back(std::move(name));
    return a->regions.back();
  };
  a->recompute = region("recompute");
  a->temporaries = region("temporaries");
  const bool full = m.opts.recompute == dsv4::Recompute::Full;
  // One set of per-slot regions for the live state and one per pipeline slot; a set never used (the pipeline
  // slots of a whole-model run, the live state of stage steps) keeps high-water 0 and gets no bytes.
  auto bind_set = [&](const std::string& set, Pool& acts, Pool& out, Pool& grad_out, auto&& block_at) {
    acts.bind(region(set + " streams+heads")), out.bind(region(set + " stage output"));
    grad_out.bind(region(set + " input gradient"));
    const int64_t n = m.l1 - m.l0 + (m.mtp_block ? 1 : 0);
    for (int64_t i = 0; i < n; ++i) {
      auto& b = block_at(i);
      const std::string blk = set + " block " + std::to_string(i);
      b.keep.bind(full ? a->recompute : region(blk + " keep"));
      b.redo.bind(a->recompute);
      b.picks.bind(region(blk + " picks"));
    }
  };
  bind_set("live", m.acts, m.out, m.grad_out, [&m](int64_t i) -> GpuBlock& {
    return i < m.l1 - m.l0 ? *m.blocks[size_t(m.l0 + i)] : *m.mtp_block;
  });
  for (size_t s = 0; s < m.slots.size(); ++s) {
    GpuModel::Impl::Slot& z = m.slots[s];
    bind_set("slot " + std::to_string(s), z.acts, z.out, z.grad_out, [&m, &z](int64_t i) -> BlockSaved& {
      return i < m.l1 - m.l0 ? z.blocks[size_t(m.l0 + i)] : z.mtp;
    });
  }
  for (Pool* p : m.backend->step_pools()) p->bind(a->temporaries);
  m.arena = std::move(a);
}

void activation_arena_plan(GpuModel::Impl& m) {
  if (!m.arena || !m.arena->overflowed() || in_flight(m)) return;
  ActivationArena& a = *m.arena;
  // What the coming forward releases before it takes anything: the last step's streams, head activations, saved
  // activations and selections (a stage's input gradients stay until their slot's next backward: their send may
  // still be reading them).
  m.acts.clear(), m.out.clear();
  m.forward_done = false;  // the head activations and streams are gone (the forward's begin re-points them)
  auto drop = [](auto& b) { b.keep.clear(), b.redo.clear(), b.picks.clear(); };
  for (int64_t l = m.l0; l < m.l1; ++l) drop(*m.blocks[size_t(l)]);
  if (m.mtp_block) drop(*m.mtp_block);
  for (GpuModel::Impl::Slot& z : m.slots) {
    z.acts.clear(), z.out.clear();
    for (int64_t l = m.l0; l < m.l1; ++l) drop(z.blocks[size_t(l)]);
    drop(z.mtp);
  }
  for (Pool* p : m.backend->step_pools()) p->clear();
  // The step's fallback buffers went back to the device pool, which keeps freed memory (GpuModel's release
  // threshold); hand the unused part back so the arena does not sit beside it.
  cudaMemPool_t pool;
  int dev = 0;
  TREX_CUDA(cudaGetDevice(&dev));
  TREX_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  TREX_CUDA(cudaMemPoolTrimTo(pool, 0));
  const std::vector<std::shared_ptr<ArenaRegion>> old = a.regions;  // alive until every pool is rebound
  std::vector<int64_t> cap(a.regions.size()), off(a.regions.size());
  int64_t total = 0;
  for (size_t i = 0; i < a.regions.size(); ++i) {
    cap[i] = ArenaRegion::align_up(std::max(a.regions[i]->capacity(), a.regions[i]->high_water()));
    off[i] = total, total += cap[i];
  }
  auto memory = total > 0 ? std::make_shared<DevMem>(size_t(total)) : nullptr;
  std::map<const ArenaRegion*, std::shared_ptr<ArenaRegion>> next;
  for (size_t i = 0; i < a.regions.size(); ++i) {
    std::shared_ptr<void> backing(memory, memory ? memory->as<void>() : nullptr);
    auto r = std::make_shared<ArenaRegion>(backing, memory ? memory->as<char>() + off[i] : nullptr, cap[i]);
    next[old[i].get()] = r;
    a.regions[i] = std::move(r);
  }
  for_each_pool(m, [&next](Pool& p) {
    if (!p.region()) return;
    auto it = next.find(p.region().get());
    TREX_CHECK(it != next.end(), "activation arena: a pool bound to a region the arena does not list");
    p.bind(it->second);
  });
  a.recompute = next.at(a.recompute.get()), a.temporaries = next.at(a.temporaries.get());
  a.memory = std::move(memory);
  ++a.plans;
}

}  // namespace trex::dsv4gpu
