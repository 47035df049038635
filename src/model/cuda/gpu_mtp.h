// The MTP module's input on the GPU for training (design §2.10, the dataflow of dsv4::mtp_input_fwd / _bwd):
// e = e_proj(enorm(Embed[token t+1])) and H[j] = h_proj(hnorm(X^L_t[j])) per stream j; the MTP block's input
// streams are H[j] + e. Its saved activations live in Impl::mtp_input (parked per pipeline slot like the rest).
#pragma once
#include <cstdint>

#include "model/cuda/gpu_impl.h"

namespace trex::dsv4gpu {

// next_ids [N] on the host (-1: no next token; checked here), already uploaded into m.mtp_input.next_ids. XL, Xmtp
// [N, n_hc, d] bf16 (Xmtp written).
void mtp_fwd(GpuModel::Impl& m, const Ctx& c, int64_t N, const int32_t* next_ids, const bf16* XL, bf16* Xmtp);
// dXmtp [N, n_hc, d] fp32 -> dXL (WRITES, or ADDS with accumulate); the parameter gradients and embed.weight's
// (the next tokens' rows) accumulate.
void mtp_bwd(GpuModel::Impl& m, const Ctx& c, int64_t N, const bf16* XL, const float* dXmtp, float* dXL,
             bool accumulate);

}  // namespace trex::dsv4gpu
