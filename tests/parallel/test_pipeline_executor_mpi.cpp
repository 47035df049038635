// The pipeline executor on a toy model cut into stages: under mpirun -np 2 and -np 4, for 1F1B and
// interleaved schedules, every rank's stage gradients and the summed loss equal the single-process
// ones (computed by each rank itself on the uncut model). Each layout runs twice: with the host policy
// (pooled buffers, one communicator, receives posted ahead) and with the CUDA backend's policy on host memory
// (stages sending from their own slots, two alternating receive buffers per direction, one communicator per
// direction, receives posted right before their compute), so the device pipeline's bookkeeping is tested here. The launcher tests re-run this binary under
// mpirun with TREX_PIPE_WORKER=1, which selects the PipeWorker tests (skipped otherwise).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_executor.h"
#include "pipeline_toy.h"

using namespace trex::parallel;
using trex::test::ToyPipeModel;
using trex::test::ToyStage;

namespace {

struct Case {
  int pp, dp, vpp;
  int64_t micro_batches;
  ScheduleKind kind;
};

// The single-process gradients of the whole model (one stage), accumulated over `steps` steps.
std::unique_ptr<ToyStage> reference(const ToyPipeModel& m, int steps, double* loss) {
  auto whole = std::make_unique<ToyStage>(m, 0, m.layers);
  *loss = 0;
  for (int s = 0; s < steps; ++s)
    for (int64_t mb = 0; mb < m.micro_batches; ++mb) {
      *loss += whole->forward(mb, nullptr, nullptr);
      whole->backward(mb, nullptr, nullptr);
    }
  return whole;
}

// The CUDA backend's memory policy (train/cuda/gpu_pipeline_cuda.cpp) on host memory: two alternating receive
// buffers per direction, no output buffers (the stages own theirs).
class AlternatingMemory final : public PipelineMemory {
 public:
  size_t act_elem_bytes() const override { return sizeof(float); }
  size_t grad_elem_bytes() const override { return sizeof(float); }
  void resize(int64_t elems) override {
    for (auto& b : act_) b.assign(size_t(elems), 0.f);
    for (auto& b : grad_) b.assign(size_t(elems), 0.f);
  }
  void* take(BoundaryRole role) override {
    if (role == BoundaryRole::ActIn) return act_[n_act_++ % 2].data();
    if (role == BoundaryRole::GradIn) return grad_[n_grad_++ % 2].data();
    throw trex::Error("alternating memory: the stages own their outputs");
  }
  void give(BoundaryRole, void*) override {}
  void after_receive(trex::comm::Work&) override {}
  void before_reuse(trex::comm::Work& w) override { w.wait(); }

 private:
  std::vector<float> act_[2], grad_[2];
  int64_t n_act_ = 0, n_grad_ = 0;
};

// A toy stage that keeps its boundary outputs in `slots` slots of its own (micro-batch m in m % slots), as
// the GPU model does: the executor sends straight from them.
class SlotStage final : public PipelineStage {
 public:
  SlotStage(std::unique_ptr<ToyStage> s, int slots) : s_(std::move(s)), out_(size_t(slots)), gin_(size_t(slots)) {}
  int64_t boundary_elems() const override { return s_->boundary_elems(); }
  bool is_first() const override { return s_->is_first(); }
  bool is_last() const override { return s_->is_last(); }
  double forward(int64_t m, const void* x_in, void* x_out) override {
    if (x_out) throw trex::Error("slot stage: given an output buffer although it owns its outputs");
    std::vector<float>& o = out_[slot(m)];
    o.assign(size_t(boundary_elems()), 0.f);
    return s_->forward(m, x_in, is_last() ? nullptr : o.data());
  }
  void backward(int64_t m, const void* dx_out, void* dx_in) override {
    if (dx_in) throw trex::Error("slot stage: given an input-gradient buffer although it owns its outputs");
    std::vector<float>& g = gin_[slot(m)];
    g.assign(size_t(boundary_elems()), 0.f);
    s_->backward(m, dx_out, is_first() ? nullptr : g.data());
  }
  int owned_slots() const override { return int(out_.size()); }
  const void* output(int64_t m) const override { return out_[slot(m)].data(); }
  const void* input_grad(int64_t m) const override { return gin_[slot(m)].data(); }
  ToyStage& toy() { return *s_; }

 private:
  size_t slot(int64_t m) const { return size_t(m % int64_t(out_.size())); }
  std::unique_ptr<ToyStage> s_;
  std::vector<std::vector<float>> out_, gin_;
};

// channels: null = the host policy over pp_group; else the device policy over these four communicators.
void run_case(trex::comm::Communicator& pp_group, const Case& c, int dp_rank,
              const PipelineChannels* channels = nullptr) {
  SCOPED_TRACE(::testing::Message() << "pp=" << c.pp << " dp=" << c.dp << " vpp=" << c.vpp << " M=" << c.micro_batches
                                    << " " << schedule_kind_name(c.kind) << " pp_rank=" << pp_group.rank()
                                    << (channels ? " device policy" : " host policy"));
  const int S = c.pp * c.vpp;
  const int64_t L = 2 * S;
  // Each DP replica gets its own data (seed), as DP ranks would; the weights are the same.
  // 160 x 8 floats (5 KiB) per boundary tensor: above the shared-memory eager limit, so a send buffer
  // reused before its send completes would corrupt what the next stage receives.
  ToyPipeModel model(L, 8, 160, c.micro_batches, 1000 + uint64_t(dp_rank));
  const int steps = 2;
  double ref_loss = 0;
  auto whole = reference(model, steps, &ref_loss);

  ScheduleSpec spec{c.pp, c.vpp, c.micro_batches, c.kind};
  if (channels) spec.lookahead = 0;
  // Per chunk at most the rank's micro-batches in flight, consecutive ones (each chunk runs them in order).
  const int slots = simulate_schedule(make_schedule(spec)).max_in_flight[size_t(pp_group.rank())];
  std::vector<ToyStage*> own;
  std::vector<std::unique_ptr<PipelineStage>> held;
  std::vector<PipelineStage*> chunks;
  for (int v = 0; v < c.vpp; ++v) {
    const int s = v * c.pp + pp_group.rank();
    auto toy = std::make_unique<ToyStage>(model, int64_t(s) * L / S, int64_t(s + 1) * L / S);
    own.push_back(toy.get());
    if (channels) held.push_back(std::make_unique<SlotStage>(std::move(toy), slots));
    else held.push_back(std::move(toy));
    chunks.push_back(held.back().get());
  }
  AlternatingMemory alternating;
  PipelineExecutorOptions eo;
  eo.agree_boundary = !channels, eo.mpi_tags = true;
  PipelineExecutor ex = channels ? PipelineExecutor(*channels, spec, chunks, alternating, eo)
                                 : PipelineExecutor(pp_group, spec, chunks);
  double loss = 0;
  for (int s = 0; s < steps; ++s) {
    PipelineStepStats st = ex.run_step(true);
    loss += st.loss;
    EXPECT_GE(st.wait_s, 0.0);
    EXPECT_GE(st.bubble_s, 0.0);
    EXPECT_GT(st.compute_s, 0.0);
    // The executor ran the schedule's memory profile, not more.
    const SimResult sim = simulate_schedule(ex.schedule());
    EXPECT_EQ(st.max_in_flight, sim.max_in_flight[size_t(pp_group.rank())]);
    if (S > 1) EXPECT_GT(st.bubble_fraction, 0.0);
    EXPECT_LT(st.bubble_fraction, 1.0);
  }
  for (const auto& stg : own) EXPECT_EQ(stg->live_micro_batches(), 0u);  // every activation freed
  pp_group.all_reduce_sum(&loss, 1);
  EXPECT_NEAR(loss, ref_loss, 1e-6 * std::abs(ref_loss));
  for (const auto& stg : own) {
    for (size_t k = 0; k < stg->grad_W().size(); ++k) {
      const size_t l = size_t(stg->first_layer()) + k;
      const auto& gw = stg->grad_W()[k];
      const auto& gb = stg->grad_b()[k];
      for (size_t i = 0; i < gw.size(); ++i)
        ASSERT_NEAR(gw[i], whole->grad_W()[l][i], 1e-6 + 1e-5 * std::abs(whole->grad_W()[l][i])) << "layer " << l << " W[" << i << "]";
      for (size_t i = 0; i < gb.size(); ++i)
        ASSERT_NEAR(gb[i], whole->grad_b()[l][i], 1e-6 + 1e-5 * std::abs(whole->grad_b()[l][i])) << "layer " << l << " b[" << i << "]";
    }
  }
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::string run_cmd(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && fgets(buf.data(), int(buf.size()), p)) out += buf.data();
  *status = p ? pclose(p) : -1;
  return out;
}

std::string mpirun(int np) {
  return "env OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
         "mpirun --allow-run-as-root --oversubscribe --bind-to none -x TREX_PIPE_WORKER=1 -np " +
         std::to_string(np) + " " + self_exe() + " --gtest_filter=PipeWorker.*";
}

bool worker() { return std::getenv("TREX_PIPE_WORKER") != nullptr; }

}  // namespace

TEST(PipeExecutor, SingleProcessOneStageMatchesReference) {
  auto local = trex::comm::make_local_communicator();
  run_case(*local, {1, 1, 1, 3, ScheduleKind::OneFOneB}, 0);
}

TEST(PipeExecutor, StageMismatchIsRefused) {
  auto local = trex::comm::make_local_communicator();
  ToyPipeModel model(4, 3, 2, 2, 1);
  ToyStage half(model, 0, 2);  // not the last stage, but the pipeline has one stage
  EXPECT_THROW(PipelineExecutor(*local, {1, 1, 2, ScheduleKind::OneFOneB}, {&half}), trex::Error);
}

TEST(PipeExecutor, TwoRanksUnderMpirun) {
  int status = 0;
  std::string out = run_cmd(mpirun(2), &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("PIPE WORKER PASS"), std::string::npos) << out;
}

TEST(PipeExecutor, FourRanksUnderMpirun) {
  int status = 0;
  std::string out = run_cmd(mpirun(4), &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("PIPE WORKER PASS"), std::string::npos) << out;
}

TEST(PipeWorker, AllLayouts) {
  if (!worker()) GTEST_SKIP() << "runs under mpirun (PipeExecutor.*Ranks* launch it)";
  auto world = trex::comm::make_world_communicator("auto");
  world->set_timeout_seconds(60);
  const int n = world->size();
  std::vector<Case> cases;
  if (n == 2) {
    cases = {{2, 1, 1, 1, ScheduleKind::OneFOneB}, {2, 1, 1, 5, ScheduleKind::OneFOneB},
             {2, 1, 2, 4, ScheduleKind::Interleaved}, {2, 1, 3, 2, ScheduleKind::Interleaved}};
  } else if (n == 4) {
    cases = {{4, 1, 1, 3, ScheduleKind::OneFOneB}, {4, 1, 1, 8, ScheduleKind::OneFOneB},
             {4, 1, 2, 8, ScheduleKind::Interleaved}, {2, 2, 1, 4, ScheduleKind::OneFOneB},
             {2, 2, 2, 4, ScheduleKind::Interleaved}};
  } else {
    FAIL() << "the pipeline worker expects 2 or 4 ranks, got " << n;
  }
  for (const Case& c : cases) {
    Mesh mesh = build_mesh(*world, {c.pp, c.dp, 1, c.vpp}, {2 * c.pp * c.vpp, 1});
    run_case(*mesh.pp_group, c, mesh.dp_rank);
    // The device policy: one communicator per direction, split from the world like GpuMeshPipeline's.
    const int colour = mesh.dp_rank * mesh.spec.tp + mesh.tp_rank;
    auto grad = world->split(colour, mesh.pp_rank);
    auto act_wrap = world->split(colour, mesh.pp_rank);
    auto grad_wrap = world->split(colour, mesh.pp_rank);
    const PipelineChannels ch{mesh.pp_group.get(), grad.get(), act_wrap.get(), grad_wrap.get()};
    run_case(*mesh.pp_group, c, mesh.dp_rank, &ch);
  }
  world->barrier();
  if (!HasFailure()) std::printf("PIPE WORKER PASS rank %d\n", world->rank());
}
