// MoE routing on the GPU (design §2.9), mirroring the router inside trex::dsv4::moe_fwd / moe_bwd:
// scores s = sqrt(softplus(logits)); selection = top-k of (s + bias) (ties: lower expert id), or
// tid2eid[token] for hash layers; gate weights g_k = routed_scale * s_k / (sum_k s_k + 1e-20). Then the token
// permutation into expert-grouped order (stable: token order within an expert, as the CPU), with per-expert
// counts and offsets computed on the device (no host synchronisation), the gather into that order and the
// weighted combine back.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace trex::cuda {

using bf16 = __nv_bfloat16;

constexpr int kRouterMaxExperts = 512;
constexpr int kRouterMaxTopk = 8;

struct RouterShape {
  int64_t n_tok = 0;
  int64_t n_experts = 0;  // E <= 512
  int64_t topk = 0;       // K <= 8
  double routed_scale = 1.0;
  bool hash = false;
};

// logits [N, E] fp32 (the router GEMM's output). bias [E] (nullable), or tid2eid [vocab, K] + token_ids [N]
// for hash layers. Writes scores [N, E], sel [N, K], weight [N, K]. status (nullable, int32, set to 0 by the
// caller) becomes 1 when a token id or a tid2eid entry is out of range (that token's sel is then clamped to
// 0): check it when convenient, no synchronisation is forced here.
void router_fwd(const RouterShape& s, const float* logits, const float* bias, const int32_t* tid2eid,
                int64_t vocab, const int32_t* token_ids, float* scores, int32_t* sel, float* weight,
                int32_t* status, cudaStream_t stream = nullptr);

// dweight [N, K] = dL/dg, dscores_extra [N, E] (nullable, e.g. the balance loss) -> dlogits [N, E] (written).
void router_bwd(const RouterShape& s, const float* logits, const float* scores, const int32_t* sel,
                const float* dweight, const float* dscores_extra, float* dlogits,
                cudaStream_t stream = nullptr);

// int32 scratch elements moe_route_plan needs.
int64_t moe_route_plan_scratch(int64_t n_tok, int64_t topk, int64_t n_experts);
// From sel [N, K]: order [N*K] (sorted position -> flat slot t*K+k), slot_pos [N*K] (its inverse) and
// offsets [E+1] (expert e owns sorted positions offsets[e] .. offsets[e+1]). Deterministic.
void moe_route_plan(const int32_t* sel, int64_t n_tok, int64_t topk, int64_t n_experts, int32_t* order,
                    int32_t* slot_pos, int32_t* offsets, int32_t* scratch, cudaStream_t stream = nullptr);

// counts [E] (written) = offsets[e + 1] - offsets[e]: the rows each expert gets, for the expert exchange's count
// all-to-all (the counts stay on the device until the exchange has moved them).
void moe_expert_counts(const int32_t* offsets, int64_t n_experts, int32_t* counts, cudaStream_t stream = nullptr);

// xe [N*K, d] (written): xe[p] = u[order[p] / K]. d % 8 == 0.
void moe_gather(bf16* xe, const bf16* u, const int32_t* order, int64_t n_tok, int64_t topk, int64_t d,
                cudaStream_t stream = nullptr);
// Row permutations of [*, d] bf16 rows by an int32 index (the expert exchange's source-major <-> expert-major
// regroup: one launch instead of one copy per (source rank, expert) block). d % 8 == 0.
// rows_gather: dst[i] = src[idx[i]]; rows_scatter: dst[idx[i]] = src[i]; i in [0, n).
void rows_gather(bf16* dst, const bf16* src, const int32_t* idx, int64_t n, int64_t d, cudaStream_t stream = nullptr);
void rows_scatter(bf16* dst, const bf16* src, const int32_t* idx, int64_t n, int64_t d, cudaStream_t stream = nullptr);
// Backward of the gather: du [N, d] (fp32, accumulated) += sum_k dxe[slot_pos[t*K+k]].
void moe_gather_bwd(float* du, const bf16* dxe, const int32_t* slot_pos, int64_t n_tok, int64_t topk,
                    int64_t d, cudaStream_t stream = nullptr);
// out [N, d] (written) = sum_k weight[t*K+k] * ye[slot_pos[t*K+k]] (+ add[t], e.g. the shared expert), summed
// in fp32 in k order. weight and add nullable (weight 1, nothing added).
void moe_combine(bf16* out, const bf16* ye, const int32_t* slot_pos, const float* weight, const bf16* add,
                 int64_t n_tok, int64_t topk, int64_t d, cudaStream_t stream = nullptr);
// The combine of partial expert outputs (expert tensor parallelism: each rank's ye is its share of the experts'
// width): out [N, d] fp32 (accumulated) += sum_k weight[t*K+k] * ye[slot_pos[t*K+k]], in k order, unrounded, so
// the sum over the ranks is rounded to bf16 once.
void moe_combine_accumulate(float* out, const bf16* ye, const int32_t* slot_pos, const float* weight,
                            int64_t n_tok, int64_t topk, int64_t d, cudaStream_t stream = nullptr);
// Backward of the combine: dye [N*K, d] (written) = weight * dout[t]; dweight [N, K] (written, nullable) =
// dout[t] . ye[p].
void moe_combine_bwd(bf16* dye, float* dweight, const bf16* dout, const bf16* ye, const int32_t* slot_pos,
                     const float* weight, int64_t n_tok, int64_t topk, int64_t d,
                     cudaStream_t stream = nullptr);

}  // namespace trex::cuda
