// The planner's model of one training step: memory per rank and time per step for a layout, from the
// model's FLOPs and bytes, the hardware profile and an implementation profile (efficiencies).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "plan/comm_volume.h"
#include "plan/layout.h"
#include "plan/model_math.h"
#include "plan/profiles.h"

namespace trex::plan {

struct MemoryBreakdown {  // GiB per rank on the stage with the highest total
  int64_t stage = 0;
  double weights = 0, grads = 0, optimizer = 0, activations = 0, logits = 0, comm_buffers = 0, swap_buffers = 0,
         fixed = 0;
  // The backward's transient buffers per model chunk (vpp of them on a rank) and the pipeline's boundary buffers,
  // sized as the GPU model allocates them (see Estimator::estimate).
  double workspace = 0;
  double total = 0;
  double capacity = 0;   // hbm_gib - reserved_gib
  double host_gib = 0;   // optimizer state held on the host (swap)
  double inflight = 0;   // micro-batches of activations held by that stage
};

struct TimeBreakdown {  // seconds per step
  double compute = 0;    // all micro-batches of the slowest stage: forward, backward, recomputation
  double recompute = 0;  // of which recomputation
  double tp = 0, ep = 0, cp = 0, pp = 0, dp = 0;  // exposed communication
  double bubble = 0;
  double optimizer = 0;  // optimizer step, Muon Newton-Schulz, exposed swap traffic
  double overhead = 0;
  double step = 0;
  double exposed_comm() const { return tp + ep + cp + pp + dp; }
};

struct Estimate {
  Layout layout;
  bool valid = false;  // the layout can run at all (check_layout)
  bool fits = false;   // ... and fits in memory
  std::string reason;  // why not valid / does not fit
  MemoryBreakdown mem;
  TimeBreakdown time;
  int64_t micro_batches = 0;
  double tokens_per_step = 0;
  double tokens_per_s = 0, tokens_per_s_per_device = 0;
  double flops_per_token = 0, six_n_per_token = 0;
  double mfu = 0, mfu_6n = 0;  // project convention and 6N convention, against the BF16 dense peak
  double model_tflops_per_device = 0;
  std::vector<int64_t> stage_blocks;  // blocks per pipeline stage (all its virtual chunks)
  // Per pipeline stage (mem above is the worst of these): memory per rank, and the stage's compute of the step's
  // micro-batches with its exposed TP / EP / CP communication (seconds; no bubble, DP or optimizer).
  std::vector<MemoryBreakdown> stage_mem;
  std::vector<double> stage_compute;
  // Per pipeline stage: one rank of that stage run alone with every collective replaced by local copies (what
  // `trex bench train --emulate-rank` runs, `--emulate-comm copy`): the micro-batches' forward, backward and
  // recomputation, the emulated communication of stage_comm (its copies on the compute stream, fully exposed),
  // the optimizer step of that stage's own shard and the step overhead. No bubble (the stage never waits for a
  // neighbour) and no link time. stage_alone_none: the same under `--emulate-comm none` (only the small
  // operations still move).
  std::vector<double> stage_alone;
  std::vector<double> stage_alone_none;
  std::vector<double> stage_optimizer;  // of which the optimizer step of the stage's shard
  // Per pipeline stage: one rank's communication per step, by collective kind (comm_volume.h): bytes, calls and
  // seconds on the emulated rank and on the real cluster (before overlap). time.dp is the slowest stage's DP
  // kinds on the cluster after the overlap fraction.
  std::vector<RankComm> stage_comm;
};

class Estimator {
 public:
  Estimator(ModelSpec model, HardwareProfile hw, ImplProfile impl, Workload w);
  Estimate estimate(Layout layout, int64_t devices) const;

  const ModelMath& math() const { return *math_; }
  const HardwareProfile& hardware() const { return hw_; }
  const ImplProfile& impl() const { return impl_; }
  const Workload& workload() const { return w_; }
  // Another implementation profile for the same model and workload (the calibration's fit evaluates many): the
  // model's parameter table and FLOPs are kept, rebuilt only where the attention kind changes.
  void set_impl(ImplProfile impl);

  // Blocks (indices into ModelMath, the MTP block last) of each of pp x vpp virtual stages: contiguous,
  // balanced by forward cost with the LM head on the last and the embedding on the first stage.
  std::vector<std::vector<int64_t>> partition(int64_t pp, int64_t vpp) const;
  // Uses these chunks (pp x vpp lists of blocks, as partition() returns them) instead of the balanced split: the
  // trainer's own stage layers (rank emulation compares one rank of that partition with its prediction).
  void set_partition(int64_t pp, int64_t vpp, std::vector<std::vector<int64_t>> chunks);
  // Saved-activation elements per token of block b under a recomputation policy on one rank of a TP group of
  // tp (before the CP split). T-Rex has no sequence parallelism: a TP rank holds every token of its micro-batch,
  // and only what belongs to its attention heads / output groups and its share of the shared expert is divided
  // by tp; the rest (the residual streams, mHC, the compressed query, K=V, compressor, indexer, router, the routed
  // experts' copies) is whole on every TP rank.
  // etp (1 or tp, GpuModelOptions::expert_tp): the routed experts' gate|up is a TP rank's share of their width.
  double activation_elems(int64_t b, Recompute rc, int64_t tp = 1, int64_t ep = 1, int64_t etp = 1) const;

 private:
  ModelSpec m_;
  dsv4::ModelConfig cfg_;  // m_ as the model's config (the GPU model's workspace shapes read it)
  HardwareProfile hw_;
  ImplProfile impl_;
  Workload w_;
  std::unique_ptr<ModelMath> math_;       // project-convention FLOPs (MFU numerator)
  std::unique_ptr<ModelMath> impl_math_;  // FLOPs as the implementation executes them
  mutable std::map<std::pair<int64_t, int64_t>, std::vector<std::vector<int64_t>>> partitions_;
  // DP bucket tables (comm_volume.h) by (experts split out by EP, tp, etp): built from the parameter table once.
  mutable std::map<std::tuple<bool, int64_t, int64_t>, BucketTable> buckets_;
  const BucketTable& buckets(bool ep_split, int64_t tp, int64_t etp) const;
};

}  // namespace trex::plan
