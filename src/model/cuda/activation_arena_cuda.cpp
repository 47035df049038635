// The activation arena's regions, their binding to the GPU model's pools, and the plan (activation_arena.h).
#include "model/cuda/activation_arena.h"

#include <algorithm>
#include <map>

#include "model/cuda/arena_layout.h"
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
    a->regions.back()->use_clock(a->clock);
    a->names.push_back(std::move(name));
    return a->regions.back();
  };
  a->recompute = region("recompute");
  a->temporaries = region("temporaries");
  // A block replayed in full keeps its activations only between its replay and its backward: in the shared region.
  auto full = [&m](int64_t i) {
    const GpuBlock& b = i < m.l1 - m.l0 ? *m.blocks[size_t(m.l0 + i)] : *m.mtp_block;
    return b.recompute == dsv4::Recompute::Full;
  };
  // One set of per-slot regions for the live state and one per pipeline slot; a set never used (the pipeline
  // slots of a whole-model run, the live state of stage steps) keeps high-water 0 and gets no bytes.
  auto bind_set = [&](const std::string& set, Pool& acts, Pool& out, Pool& grad_out, auto&& block_at) {
    acts.bind(region(set + " streams+heads")), out.bind(region(set + " stage output"));
    grad_out.bind(region(set + " input gradient"));
    const int64_t n = m.l1 - m.l0 + (m.mtp_block ? 1 : 0);
    for (int64_t i = 0; i < n; ++i) {
      auto& b = block_at(i);
      const std::string blk = set + " block " + std::to_string(i);
      b.keep.bind(full(i) ? a->recompute : region(blk + " keep"));
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

int64_t ActivationArena::sum_of_peaks() const {
  int64_t s = 0;
  for (const auto& r : regions) s += r->high_water();
  return std::max(s, planned_sum_of_peaks);
}

namespace {

// A new plan from the step just traced (activation_arena.h).
void relayout(GpuModel::Impl& m) {
  ActivationArena& a = *m.arena;
  // The plan, from the trace read before the releases below (which would end the still-live requests in it).
  const ArenaLayout layout = plan_arena_layout(a.regions, a.packed_plans < kPackedPlans);
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
  // threshold); hand it back so that the arena does not sit beside it. A stream-ordered free counts as in use
  // until the device has passed it: the trim waits for the device first (once per plan).
  cudaMemPool_t pool;
  int dev = 0;
  TREX_CUDA(cudaGetDevice(&dev));
  TREX_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  TREX_CUDA(cudaDeviceSynchronize());
  TREX_CUDA(cudaMemPoolTrimTo(pool, 0));
  // Packed from the traced step while steps repeat it (arena_layout.h: when packing saves bytes); a packed plan
  // that a later step did not fit (its requests differ from the traced step's) is followed by packed ones up to
  // kPackedPlans, then by stacked ones (each region at its high-water mark: they hold any order of requests within
  // the marks).
  auto memory = layout.bytes > 0 ? std::make_shared<DevMem>(size_t(layout.bytes)) : nullptr;
  const std::vector<std::shared_ptr<ArenaRegion>> old = a.regions;  // alive until every pool is rebound
  std::shared_ptr<void> backing(memory, memory ? memory->as<void>() : nullptr);
  Regions next = make_arena_regions(layout, a.regions, backing, memory ? memory->as<char>() : nullptr,
                                    layout.bytes, a.clock);
  std::map<const ArenaRegion*, std::shared_ptr<ArenaRegion>> by_old;
  for (size_t i = 0; i < old.size(); ++i) by_old[old[i].get()] = next[i];
  for_each_pool(m, [&by_old](Pool& p) {
    if (!p.region()) return;
    auto it = by_old.find(p.region().get());
    TREX_CHECK(it != by_old.end(), "activation arena: a pool bound to a region the arena does not list");
    p.bind(it->second);
  });
  a.recompute = by_old.at(a.recompute.get()), a.temporaries = by_old.at(a.temporaries.get());
  a.regions = std::move(next);
  a.memory = std::move(memory);
  a.planned_sum_of_peaks = layout.sum_of_peaks, a.planned_peak_live = layout.peak_live;
  a.packed = layout.packed;
  a.packed_plans += layout.packed;
  ++a.plans;
}

}  // namespace

void activation_arena_plan(GpuModel::Impl& m) {
  if (!m.arena || in_flight(m)) return;
  ActivationArena& a = *m.arena;
  if (a.overflowed()) relayout(m);
  for (auto& r : a.regions) r->begin_step();
  a.clock->begin_step();
}

}  // namespace trex::dsv4gpu
