// `trex train` with several processes or a `parallel:` section (run.h): communicator, mesh, this rank's part
// of the model, its MeshEngine, and the Trainer's loop.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "data/chat.h"
#include "model/dsv4/partition.h"
#include "parallel/ep_exchange.h"
#include "parallel/mesh.h"
#include "parallel/pipeline_schedule.h"
#include "parallel/zero1_optimizer.h"
#include "train/mesh_engine.h"
#include "train/trainer.h"
#include "train/dsv4_stage.h"
#include "train/run.h"
#include "train/sharded_checkpoint.h"

namespace trex::train {

namespace fs = std::filesystem;

namespace {

// Most micro-batches each local chunk holds at once under the schedule (its activation slots).
std::vector<int64_t> slots_per_chunk(const parallel::Schedule& s, int rank) {
  std::vector<int64_t> live(size_t(s.spec.vpp), 0), most(size_t(s.spec.vpp), 1);
  for (const auto& a : s.ranks[size_t(rank)]) {
    if (a.op == parallel::PipeOp::Forward) most[size_t(a.chunk)] = std::max(most[size_t(a.chunk)], ++live[size_t(a.chunk)]);
    if (a.op == parallel::PipeOp::Backward) --live[size_t(a.chunk)];
  }
  return most;
}

// This rank's DeepSeek-V4 chunks (one per virtual stage), with its expert shard and EP exchanges.
struct Dsv4Parts {
  std::vector<std::unique_ptr<parallel::EpExchange>> exchanges;
  std::vector<std::unique_ptr<Dsv4Stage>> stages;
};

StagedParts dsv4_staged_parts(const TrainConfig& cfg, const dsv4::ModelConfig& mc, const Dsv4TrainOptions& o,
                              parallel::Mesh& mesh, const parallel::Schedule& sched, int rank) {
  auto own = std::make_shared<Dsv4Parts>();
  const int P = mesh.spec.pp, V = mesh.spec.vpp;
  const std::vector<dsv4::ModelPartition> parts = dsv4::split_layers(mc, int64_t(P) * V, cfg.parallel.pad_layers);
  const std::vector<int64_t> slots = slots_per_chunk(sched, mesh.pp_rank);
  const int E = int(mc.n_routed_experts);
  for (int v = 0; v < V; ++v) {
    dsv4::ModelPartition part = parts[size_t(v * P + mesh.pp_rank)];
    if (mesh.spec.ep > 1) {
      part.expert_begin = mesh.first_local_expert(E);
      part.expert_end = part.expert_begin + mesh.n_local_experts(E);
    }
    own->stages.push_back(std::make_unique<Dsv4Stage>(mc, part, o, cfg.seed, slots[size_t(v)]));
    if (mesh.spec.ep > 1) {
      own->exchanges.push_back(std::make_unique<parallel::EpExchange>(*mesh.ep_group, E, mc.hidden));
      own->stages.back()->model().set_expert_exchange(own->exchanges.back().get());
    }
  }
  // Start weights: every rank loads the tensors of its chunks (and expert shard) by official name.
  const std::string where = cfg.where + ": model";
  if (cfg.model.contains("init_from"))
    for (auto& s : own->stages) s->load_pretrained(cfg.model["init_from"].get<std::string>());
  if (cfg.model.contains("init_from_run"))
    for (auto& s : own->stages) load_run_weights(s->params(), cfg.model["init_from_run"].get<std::string>(), where, rank);
  StagedParts sp;
  Dsv4Parts* d = own.get();
  for (auto& s : d->stages) sp.chunks.push_back(s.get());
  sp.feed = [d](const std::vector<data::Batch>& mbs, double) {
    for (auto& s : d->stages) s->set_step_batches(mbs);  // loss scale 1 / mbs.size()
  };
  sp.params = [d] {
    std::vector<optim::ParamRef> all;
    for (auto& s : d->stages) {
      std::vector<optim::ParamRef> p = s->params();
      all.insert(all.end(), p.begin(), p.end());
    }
    return all;
  };
  sp.zero_grads = [d] {
    for (auto& s : d->stages) s->zero_grads();
  };
  sp.set_controls = [d](const StepControls& c) {
    for (auto& s : d->stages) s->set_controls(c);
  };
  sp.set_grads_ready = [d](GradsReady f) {
    for (auto& s : d->stages) {
      if (!f) {
        s->set_grad_ready_hook(nullptr);
        continue;
      }
      s->set_grad_ready_hook([f](int64_t, const std::vector<const dsv4::ParamInfo*>& ps) {
        std::vector<std::string> names;
        names.reserve(ps.size());
        for (const auto* p : ps) names.push_back(p->name);
        f(names);
      });
    }
  };
  sp.sum_expert_loads = [d](comm::Communicator& dp) {
    for (auto& s : d->stages) parallel::all_reduce_expert_loads(dp, s->expert_load_sums());
  };
  sp.after_optimizer_step = [d] {
    for (auto& s : d->stages) s->after_optimizer_step();
  };
  for (auto& s : d->stages)
    for (const auto& n : s->shared_params())
      if (std::find(sp.shared_params.begin(), sp.shared_params.end(), n) == sp.shared_params.end())
        sp.shared_params.push_back(n);
  sp.flops_per_token = [mc](int64_t seq) { return dsv4_flops_per_token(mc, seq); };
  sp.description = fmt::format("DeepSeek-V4 (hidden {}, {} layers, {} experts top-{}, vocab {}), stage{} {} of {}",
                               mc.hidden, mc.n_layers, mc.n_routed_experts, mc.topk, mc.vocab_size, V > 1 ? "s" : "",
                               mesh.pp_rank, P * V);
  sp.owner = own;
  return sp;
}

}  // namespace

TrainResult run_distributed_training(const TrainConfig& cfg_in, const fs::path& config, const fs::path& out_dir,
                                     const RunOptions& opts) {
  TrainConfig cfg = cfg_in;
  std::unique_ptr<comm::Communicator> world = comm::make_world_communicator(cfg.parallel.comm);
  world->set_timeout_seconds(cfg.parallel.timeout_s);
  if (!cfg.parallel.present) cfg.parallel.mesh = {1, world->size(), 1, 1};  // plain data parallelism

  data::Tokenizer tok = data::Tokenizer::load(cfg.tokenizer);
  const fs::path shards = prepare_run_on_lead(cfg, config, out_dir, opts, tok, *world);
  data::ShardDataset ds(shards);
  check_dataset(cfg, config, shards, ds, tok);

  dsv4::ModelConfig mc;
  Dsv4TrainOptions o;
  parallel::ModelShape shape{1, 1};
  if (cfg.model_type == "dsv4") {
    dsv4_model_setup(cfg, tok, &mc, &o);
    shape = {int(mc.n_layers), int(mc.n_routed_experts)};
  }
  const std::string why = check_parallel_config(cfg, world->size(), shape);
  TREX_CHECK(why.empty(), "{}: impossible parallel layout: {}", config.string(), why);
  // The CPU mesh engine shards the optimiser (ZeRO-1) and reduces in fp32; the other levels are the GPU's.
  TREX_CHECK(cfg.parallel.zero == 1 && cfg.parallel.grad_reduce_dtype == "fp32",
             "{}: parallel.zero {} / grad_reduce_dtype {} run on device cuda only (the CPU trainer runs zero 1 with "
             "fp32 reduction)",
             config.string(), cfg.parallel.zero, cfg.parallel.grad_reduce_dtype);
  // The CPU model has no tensor-parallel split (the GPU model's is model/cuda, GpuModelOptions::tp).
  TREX_CHECK(cfg.parallel.mesh.tp == 1,
             "{}: tensor parallelism (parallel.tp={}) runs on device cuda only; the CPU trainer needs tp: 1",
             config.string(), cfg.parallel.mesh.tp);
  parallel::Mesh mesh = parallel::build_mesh(*world, cfg.parallel.mesh, shape);
  const parallel::ScheduleSpec spec{mesh.spec.pp, mesh.spec.vpp, cfg.grad_accum / mesh.spec.dp, cfg.parallel.schedule};

  std::unique_ptr<RankModel> model;
  if (cfg.model_type == "toy") {
    TREX_CHECK(mesh.spec.pp == 1 && mesh.spec.ep == 1,
               "{}: the toy model has no stages or experts: it runs data-parallel only (pp=1, ep=1)", config.string());
    model = make_trainable_rank_model(make_model(cfg, tok));
  } else {
    const parallel::Schedule sched = parallel::make_schedule(spec);
    model = make_pipelined_rank_model(dsv4_staged_parts(cfg, mc, o, mesh, sched, world->rank()), *mesh.pp_group,
                                      spec);
  }
  TrainerOptions topt;
  topt.stop_at = opts.max_steps;
  topt.show_progress = opts.show_progress;
  TrainResult r;
  try {
    MeshEngine engine(cfg, *world, mesh, *model);
    r = Trainer(cfg, out_dir, engine, ds, data::ChatTokens::from(tok).eos, topt).run();
  } catch (const std::exception& e) {
    // This rank cannot go on: the others must not wait for it in a collective until the timeout (MPI: the
    // message names this rank and the job is aborted).
    world->abort(e.what());
    throw;
  }
  model.reset();  // the stages' exchanges use the mesh's groups
  return r;
}

}  // namespace trex::train
