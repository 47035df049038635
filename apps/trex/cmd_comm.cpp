// `trex comm test`: checks the collectives and the expert-parallel dispatch/combine on whatever launched
// it (mpirun -np N, srun, or a single process), like nccl-tests for a cluster. Exits non-zero on any
// mismatch; with --hang-rank R, rank R stops answering so the others show the time-out behaviour.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "command.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "parallel/expert_dispatch.h"
#include "parallel/mesh.h"

namespace {

struct CommTestOptions {
  std::string backend = "auto";
  std::string layout;
  int experts = 8;
  int topk = 2;
  int tokens = 64;
  int hidden = 16;
  int hang_rank = -1;
  double timeout = 600;
};

int check_collectives(trex::comm::Communicator& c) {
  int errors = 0;
  const int n = 5, r = c.rank(), p = c.size();
  std::vector<float> buf(n);
  for (int i = 0; i < n; ++i) buf[i] = float(r + 1) * float(i + 1);
  c.all_reduce_sum(buf.data(), n);
  for (int i = 0; i < n; ++i) errors += buf[i] != float(p * (p + 1) / 2) * float(i + 1);
  std::vector<float> mine(n, float(r)), all(size_t(n * p));
  c.all_gather(mine.data(), all.data(), n, trex::comm::ElemType::F32)->wait();
  for (int q = 0; q < p; ++q)
    for (int i = 0; i < n; ++i) errors += all[size_t(q * n + i)] != float(q);
  std::vector<float> full(size_t(n * p)), part(n);
  for (int q = 0; q < p; ++q)
    for (int i = 0; i < n; ++i) full[size_t(q * n + i)] = float(q * 100 + i + r);
  c.reduce_scatter(full.data(), part.data(), n, trex::comm::ElemType::F32, trex::comm::ReduceOp::Sum)->wait();
  for (int i = 0; i < n; ++i) errors += part[i] != float(p * (r * 100 + i) + p * (p - 1) / 2);
  return errors;
}

// Experts scale their input by (global expert id + 1): after dispatch -> expert -> combine every slot
// must hold its token's row times (its expert + 1). The backward pair is checked the same way.
int check_dispatch(trex::parallel::Mesh& mesh, const CommTestOptions& o, bool skewed) {
  using trex::parallel::ExpertDispatcher;
  ExpertDispatcher disp(*mesh.ep_group, o.experts, o.hidden);
  std::mt19937 rng(1234u + unsigned(mesh.world_rank));
  std::vector<int32_t> route(size_t(o.tokens * o.topk));
  for (int t = 0; t < o.tokens; ++t) {
    std::vector<int> ids(size_t(o.experts));
    for (int e = 0; e < o.experts; ++e) ids[size_t(e)] = e;
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int j = 0; j < o.topk; ++j) route[size_t(t * o.topk + j)] = skewed ? j : ids[size_t(j)];
  }
  std::vector<float> x(size_t(o.tokens * o.hidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(mesh.world_rank * 1000) + float(i % 997) * 0.5f;
  auto h = disp.plan(route.data(), o.tokens, o.topk);
  std::vector<float> grouped;
  auto pending = disp.dispatch(h, x.data(), &grouped);
  pending.wait();
  int first = mesh.first_local_expert(o.experts);
  int64_t row = 0;
  for (int e = 0; e < h.n_local_experts; ++e)
    for (int64_t i = 0; i < h.expert_counts[size_t(e)]; ++i, ++row)
      for (int d = 0; d < o.hidden; ++d) grouped[size_t(row * o.hidden + d)] *= float(first + e + 1);
  std::vector<float> slots;
  auto back = disp.combine(h, grouped.data(), &slots);
  back.wait();
  int errors = 0;
  for (int t = 0; t < o.tokens; ++t)
    for (int j = 0; j < o.topk; ++j)
      for (int d = 0; d < o.hidden; ++d) {
        float want = x[size_t(t * o.hidden + d)] * float(route[size_t(t * o.topk + j)] + 1);
        errors += slots[size_t((t * o.topk + j) * o.hidden + d)] != want;
      }
  // Backward of combine = dispatch of slot rows; it must land exactly where the forward rows were.
  std::vector<float> grouped2;
  auto again = disp.dispatch_slots(h, slots.data(), &grouped2);
  again.wait();
  errors += grouped2 != grouped;
  return errors;
}

void run_comm_test(const CommTestOptions& o) {
  auto world = trex::comm::make_world_communicator(o.backend);
  world->set_timeout_seconds(o.timeout);
  trex::parallel::MeshSpec spec;
  if (o.layout.empty()) {
    spec.dp = world->size();
    spec.ep = world->size();
  } else {
    spec = trex::parallel::parse_mesh_spec(o.layout);
  }
  auto mesh = trex::parallel::build_mesh(*world, spec, {std::max(1, spec.pp), o.experts});
  mesh.ep_group->set_timeout_seconds(o.timeout);
  if (o.hang_rank == world->rank()) {
    std::fprintf(stderr, "rank %d: --hang-rank: not answering\n", world->rank());
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
  int errors = check_collectives(*world);
  errors += check_collectives(*mesh.dp_group);
  errors += check_dispatch(mesh, o, false);
  errors += check_dispatch(mesh, o, true);
  int total = errors;
  world->all_reduce(&total, 1, trex::comm::ElemType::I32, trex::comm::ReduceOp::Sum)->wait();
  if (world->rank() == 0)
    std::printf("%s\n", fmt::format(R"({{"backend": "{}", "ranks": {}, "layout": "pp={} dp={} ep={}", "errors": {}, "pass": {}}})",
                                    world->backend(), world->size(), spec.pp, spec.dp, spec.ep, total,
                                    total == 0 ? "true" : "false")
                            .c_str());
  if (total != 0) trex::cli::exit_with(1);
}

const bool registered = trex::cli::register_command(
    {"comm", "Communication checks (collectives, expert-parallel dispatch/combine) under any launcher",
     [](CLI::App& app) {
       app.require_subcommand(1);
       auto* test = app.add_subcommand("test", "Check collectives and EP dispatch/combine on all ranks");
       auto o = std::make_shared<CommTestOptions>();
       test->add_option("--backend", o->backend, "auto, mpi or local")->capture_default_str();
       test->add_option("--layout", o->layout, "parallel layout, e.g. pp=1,dp=4,ep=2 (default: dp=ep=ranks)");
       test->add_option("--experts", o->experts, "routed experts")->capture_default_str();
       test->add_option("--topk", o->topk, "experts per token")->capture_default_str();
       test->add_option("--tokens", o->tokens, "tokens per rank")->capture_default_str();
       test->add_option("--timeout", o->timeout, "seconds before a stuck collective aborts the job")
           ->capture_default_str();
       test->add_option("--hang-rank", o->hang_rank, "make this rank stop answering (failure test)");
       test->callback([o] { run_comm_test(*o); });
     }});

}  // namespace
