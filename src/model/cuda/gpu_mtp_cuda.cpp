// The MTP input's training step on the GPU (gpu_mtp.h): bf16 GEMMs with fp32 weight gradients, RMSNorms with
// fp32 rstd, as the main layers' projections.
#include "model/cuda/gpu_mtp.h"

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/mtp_input.h"
#include "kernels/cuda/speculative_rows.h"
#include "kernels/cuda/tensor_ops.h"

namespace trex::dsv4gpu {

void mtp_fwd(GpuModel::Impl& m, const Ctx& c, int64_t N, const int32_t* next_ids, const bf16* XL, bf16* Xmtp) {
  const dsv4::ModelConfig& cfg = m.cfg;
  const int64_t d = cfg.hidden, hc = cfg.hc_mult, V = cfg.vocab_size;
  const float eps = float(cfg.rms_eps);
  for (int64_t i = 0; i < N; ++i)
    TREX_CHECK(next_ids[i] >= -1 && next_ids[i] < V, "GPU model MTP: next token id {} at position {} outside [-1, {})",
               next_ids[i], i, V);
  MtpInputSaved& s = m.mtp_input;
  TREX_CHECK(s.next_ids.bytes() >= size_t(N) * sizeof(int32_t),
             "GPU model MTP: the next token ids are not on the device");
  Pool& k = m.acts;
  s.emb = k.take<bf16>(N * d), s.e_norm = k.take<bf16>(N * d), s.e_rstd = k.take<float>(N);
  s.h_norm = k.take<bf16>(N * hc * d), s.h_rstd = k.take<float>(N * hc);
  Pool tmp(c.scratch);
  bf16* e = tmp.take<bf16>(N * d);
  cuda::embed_rows_masked_fwd(s.emb, s.next_ids.as<int32_t>(), m.b16("embed.weight"), N, d);
  cuda::rmsnorm_fwd(s.e_norm, s.e_rstd, s.emb, m.b16("mtp.0.enorm.weight"), N, d, eps);
  c.lin.fwd(e, s.e_norm, m.b16("mtp.0.e_proj.weight"), N, d, d);
  cuda::rmsnorm_fwd(s.h_norm, s.h_rstd, XL, m.b16("mtp.0.hnorm.weight"), N * hc, d, eps);
  c.lin.fwd(Xmtp, s.h_norm, m.b16("mtp.0.h_proj.weight"), N * hc, d, d);
  cuda::add_to_streams_bf16(Xmtp, e, N, hc, d);
}

void mtp_bwd(GpuModel::Impl& m, const Ctx& c, int64_t N, const bf16* XL, const float* dXmtp, float* dXL,
             bool accumulate) {
  const dsv4::ModelConfig& cfg = m.cfg;
  const int64_t d = cfg.hidden, hc = cfg.hc_mult;
  const MtpInputSaved& s = m.mtp_input;
  TREX_CHECK(s.h_norm, "GPU model MTP: backward without the MTP input's forward");
  Pool tmp(c.scratch);
  // The streams' path: h_proj, hnorm -> dXL.
  bf16* dXb = tmp.take<bf16>(N * hc * d);
  cuda::cast_f32_to_bf16(dXb, dXmtp, N * hc * d);
  c.lin.dw(m.g32("mtp.0.h_proj.weight"), dXb, s.h_norm, N * hc, d, d);
  bf16* dhn = tmp.take<bf16>(N * hc * d);
  c.lin.dx(dhn, dXb, m.b16("mtp.0.h_proj.weight"), N * hc, d, d);
  bf16* dxl = dXb;  // dXb is consumed
  rmsnorm_bwd_full(c, dxl, m.g32("mtp.0.hnorm.weight"), dhn, XL, m.b16("mtp.0.hnorm.weight"), s.h_rstd, N * hc, d);
  if (accumulate)
    cuda::add_bf16_to_f32(dXL, dxl, N * hc * d);
  else
    cuda::cast_bf16_to_f32(dXL, dxl, N * hc * d);
  // The embedding's path: e broadcast over the streams, e_proj, enorm -> embed.weight's rows of the next tokens.
  bf16* de = tmp.take<bf16>(N * d);
  cuda::sum_streams_f32_to_bf16(de, dXmtp, N, hc, d);
  c.lin.dw(m.g32("mtp.0.e_proj.weight"), de, s.e_norm, N, d, d);
  bf16* den = tmp.take<bf16>(N * d);
  c.lin.dx(den, de, m.b16("mtp.0.e_proj.weight"), N, d, d);
  bf16* demb = de;  // de is consumed
  rmsnorm_bwd_full(c, demb, m.g32("mtp.0.enorm.weight"), den, s.emb, m.b16("mtp.0.enorm.weight"), s.e_rstd, N, d);
  cuda::embed_rows_masked_bwd(m.g32("embed.weight"), s.next_ids.as<int32_t>(), demb, N, d);
}

}  // namespace trex::dsv4gpu
