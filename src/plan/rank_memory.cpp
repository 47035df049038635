#include "plan/rank_memory.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "model/dsv4/param_table.h"

namespace trex::plan {

RankParamState rank_param_state(const dsv4::ModelConfig& cfg, int64_t dp, int64_t ep, int64_t dp_rank, int zero,
                                int64_t tp, int64_t etp) {
  TREX_CHECK(zero >= 1 && zero <= 3, "rank state: zero {} (the GPU trainer runs 1, 2 and 3)", zero);
  TREX_CHECK(tp >= 1, "rank state: tp={} must be >= 1", tp);
  TREX_CHECK(etp == 1 || etp == tp, "rank state: etp={} must be 1 or tp={}", etp, tp);
  const dsv4::TpExperts split = dsv4::tp_experts_of(etp);
  const int64_t E = cfg.n_routed_experts;
  TREX_CHECK(dp >= 1 && ep >= 1 && dp % ep == 0, "rank state: ep={} must divide dp={}", ep, dp);
  TREX_CHECK(E % ep == 0, "rank state: ep={} does not divide the {} routed experts", ep, E);
  TREX_CHECK(dp_rank >= 0 && dp_rank < dp, "rank state: DP rank {} outside [0, {})", dp_rank, dp);
  const int64_t ep_rank = dp_rank % ep, per = E / ep, edp = dp / ep;
  RankParamState r;
  // ZeRO-3's gather units: each layer's bucket, the embedding's, the head's, the MTP module's (bf16-read tensors
  // in the DP buckets: the routed experts too when ep is 1).
  std::map<int64_t, int64_t> layer_unit;
  int64_t root_units = 0;
  for (const dsv4::ParamSpec& s : dsv4::param_table(cfg)) {
    if (!s.trained()) continue;  // router biases and hash tables: buffers, no gradient or optimiser state
    const int64_t n = numel(dsv4::tp_local_shape(s.shape, dsv4::tp_split_axis(s.name, split), int(tp)));
    const bool in_bucket = s.dtype == DType::BF16 && (s.expert < 0 || ep == 1);
    if (zero == 3 && in_bucket) {
      if (s.part == dsv4::ParamPart::Layer)
        layer_unit[s.layer] += n;
      else
        root_units += n;
    }
    if (s.expert >= 0) {
      if (s.expert / per != ep_rank) continue;
      r.experts += n;
      r.owned += double(n) / double(edp);
      // Without expert parallelism the experts sit in their layer's bucket (gpu_params_cuda.cpp): ZeRO-2 / 3 keep
      // their gradients (and ZeRO-3 their weights) as this rank's 1/dp share, as the dense tensors'. With it they
      // form region X, whose gradients and weights stay whole (reduce-scattered over the replicas in place).
      r.grads += zero >= 2 && in_bucket ? double(n) / double(dp) : double(n);
      r.weights += zero == 3 && in_bucket ? double(n) / double(dp) : double(n);
    } else {
      r.dense += n;
      const double share = s.dtype == DType::BF16 ? double(n) / double(dp) : double(n);
      r.owned += share;
      r.grads += zero >= 2 ? share : double(n);
      r.weights += zero == 3 ? share : double(n);
    }
  }
  if (zero == 3 && dp > 1) {
    int64_t largest = 0;
    for (const auto& [l, n] : layer_unit) largest = std::max(largest, n);
    r.gathered = double(2 * largest + root_units);
  }
  if (dp == 1) r.weights = double(r.held()), r.gathered = 0;  // one rank: nothing to shard
  return r;
}

}  // namespace trex::plan
