// MoE FFN of the GPU model (design §2.9), the dataflow of trex::dsv4::moe_fwd / moe_bwd: fp32 router logits,
// sqrt(softplus) scores, hash or bias-corrected top-k routing, expert-grouped permutation, clamped SwiGLU experts
// with fused w1|w3 weights, one shared expert, weighted combine. The routed experts run as one GEMM per non-empty
// expert (the per-expert counts come back to the host once per layer and pass); a grouped GEMM would remove the
// loop and that synchronisation.
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/tensor_ops.h"
#include "train/cuda/gpu_internal.h"

namespace trex::dsv4gpu {

namespace {

cuda::RouterShape router_shape(const Ctx& c, const GpuBlock& b, bool forced) {
  cuda::RouterShape r;
  r.n_tok = c.lay->N;
  r.n_experts = c.cfg->n_routed_experts;
  r.topk = c.cfg->topk;
  r.routed_scale = c.cfg->routed_scale;
  r.hash = b.hash || forced;
  return r;
}

}  // namespace

void moe_fwd(const Ctx& c, GpuBlock& b, const int32_t* injected_sel) {
  const int64_t N = c.lay->N, d = c.cfg->hidden, E = c.cfg->n_routed_experts, K = c.cfg->topk, f = c.cfg->moe_inter;
  const int64_t fs = f * c.cfg->n_shared_experts;
  const float limit = float(c.cfg->swiglu_limit);
  Pool& keep = b.keep;
  MoeActs& m = b.mo;
  const MoeW& w = b.mw;
  m.logits = keep.take<float>(N * E), m.scores = keep.take<float>(N * E), m.weight = keep.take<float>(N * K);
  m.sel = keep.take<int32_t>(N * K), m.order = keep.take<int32_t>(N * K), m.slot_pos = keep.take<int32_t>(N * K);
  m.offsets = keep.take<int32_t>(E + 1);
  c.lin.fwd(m.logits, b.u, w.gate, N, d, E, true);
  Pool tmp;
  int32_t* status = tmp.zeros<int32_t>(1);
  if (injected_sel) {
    // The injected selection acts as a per-token "hash table": weights still come from this forward's scores.
    int32_t* table = tmp.take<int32_t>(N * K);
    TREX_CUDA(cudaMemcpyAsync(table, injected_sel, size_t(N * K) * sizeof(int32_t), cudaMemcpyHostToDevice));
    cuda::router_fwd(router_shape(c, b, true), m.logits, nullptr, table, N, c.lay->token_iota.as<int32_t>(),
                     m.scores, m.sel, m.weight, status);
  } else {
    cuda::router_fwd(router_shape(c, b, false), m.logits, w.bias, w.tid2eid, c.cfg->vocab_size,
                     c.lay->ids.as<int32_t>(), m.scores, m.sel, m.weight, status);
  }
  int32_t* scratch = tmp.take<int32_t>(cuda::moe_route_plan_scratch(N, K, E));
  cuda::moe_route_plan(m.sel, N, K, E, m.order, m.slot_pos, m.offsets, scratch);
  m.h_offsets.assign(size_t(E + 1), 0);
  int32_t h_status = 0;
  TREX_CUDA(cudaMemcpy(m.h_offsets.data(), m.offsets, size_t(E + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost));
  TREX_CUDA(cudaMemcpy(&h_status, status, sizeof(int32_t), cudaMemcpyDeviceToHost));
  TREX_CHECK(h_status == 0, "MoE (CUDA) {}: a token id or a tid2eid / injected entry is out of range", b.prefix);

  bf16* xe = tmp.take<bf16>(N * K * d);
  cuda::moe_gather(xe, b.u, m.order, N, K, d);
  m.gu = keep.take<bf16>(N * K * 2 * f);
  bf16* h = tmp.take<bf16>(N * K * f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = m.h_offsets[size_t(e)], n = m.h_offsets[size_t(e + 1)] - r0;
    if (n > 0) c.lin.fwd(m.gu + r0 * 2 * f, xe + r0 * d, w.w13 + e * 2 * f * d, n, d, 2 * f);
  }
  cuda::swiglu_fwd(h, m.gu, N * K, f, limit);
  m.ye = keep.take<bf16>(N * K * d);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = m.h_offsets[size_t(e)], n = m.h_offsets[size_t(e + 1)] - r0;
    if (n > 0) c.lin.fwd(m.ye + r0 * d, h + r0 * f, w.w2 + e * d * f, n, f, d);
  }
  const bf16* add = nullptr;
  if (fs > 0) {
    m.sgu = keep.take<bf16>(N * 2 * fs);
    c.lin.fwd(m.sgu, b.u, w.sw13, N, d, 2 * fs);
    bf16* sh = tmp.take<bf16>(N * fs);
    cuda::swiglu_fwd(sh, m.sgu, N, fs, limit);
    m.sy = keep.take<bf16>(N * d);
    c.lin.fwd(m.sy, sh, w.sw2, N, fs, d);
    add = m.sy;
  }
  cuda::moe_combine(b.y_f, m.ye, m.slot_pos, m.weight, add, N, K, d);
}

void moe_bwd(const Ctx& c, GpuBlock& b, const bf16* dout, float* du) {
  const int64_t N = c.lay->N, d = c.cfg->hidden, E = c.cfg->n_routed_experts, K = c.cfg->topk, f = c.cfg->moe_inter;
  const int64_t fs = f * c.cfg->n_shared_experts;
  const float limit = float(c.cfg->swiglu_limit);
  const MoeActs& m = b.mo;
  const MoeW& w = b.mw;
  Pool tmp;
  bf16* dye = tmp.take<bf16>(N * K * d);
  float* dweight = tmp.take<float>(N * K);
  cuda::moe_combine_bwd(dye, dweight, dout, m.ye, m.slot_pos, m.weight, N, K, d);

  if (fs > 0) {
    bf16* sh = tmp.take<bf16>(N * fs);
    cuda::swiglu_fwd(sh, m.sgu, N, fs, limit);
    c.lin.dw(w.g_sw2, dout, sh, N, fs, d);
    bf16* dsh = sh;
    c.lin.dx(dsh, dout, w.sw2, N, fs, d);
    bf16* dsgu = tmp.take<bf16>(N * 2 * fs);
    cuda::swiglu_bwd(dsgu, dsh, m.sgu, N, fs, limit);
    c.lin.dw(w.g_sw13, dsgu, b.u, N, d, 2 * fs);
    c.lin.dx(du, dsgu, w.sw13, N, d, 2 * fs, true, 1.f);
  }

  bf16* h = tmp.take<bf16>(N * K * f);
  cuda::swiglu_fwd(h, m.gu, N * K, f, limit);
  bf16* dh = tmp.take<bf16>(N * K * f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = m.h_offsets[size_t(e)], n = m.h_offsets[size_t(e + 1)] - r0;
    if (n == 0) continue;
    c.lin.dx(dh + r0 * f, dye + r0 * d, w.w2 + e * d * f, n, f, d);
    c.lin.dw(w.g_w2 + e * d * f, dye + r0 * d, h + r0 * f, n, f, d);
  }
  bf16* dgu = tmp.take<bf16>(N * K * 2 * f);
  cuda::swiglu_bwd(dgu, dh, m.gu, N * K, f, limit);
  bf16* xe = dye;  // dye is consumed: reuse it for the re-gathered expert inputs, then for dxe
  cuda::moe_gather(xe, b.u, m.order, N, K, d);
  bf16* dxe = tmp.take<bf16>(N * K * d);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = m.h_offsets[size_t(e)], n = m.h_offsets[size_t(e + 1)] - r0;
    if (n == 0) continue;
    c.lin.dw(w.g_w13 + e * 2 * f * d, dgu + r0 * 2 * f, xe + r0 * d, n, d, 2 * f);
    c.lin.dx(dxe + r0 * d, dgu + r0 * 2 * f, w.w13 + e * 2 * f * d, n, d, 2 * f);
  }
  cuda::moe_gather_bwd(du, dxe, m.slot_pos, N, K, d);

  // Router: gate weights -> scores -> logits -> gate GEMM.
  float* dlogits = tmp.take<float>(N * E);
  cuda::router_bwd(router_shape(c, b, false), m.logits, m.scores, m.sel, dweight, nullptr, dlogits);
  bf16* dlogits_b = tmp.take<bf16>(N * E);
  cuda::cast_f32_to_bf16(dlogits_b, dlogits, N * E);
  c.lin.dw(w.g_gate, dlogits_b, b.u, N, d, E);
  c.lin.dx(du, dlogits_b, w.gate, N, d, E, true, 1.f);
}

}  // namespace trex::dsv4gpu
