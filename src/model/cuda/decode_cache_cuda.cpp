#include "model/cuda/decode_cache.h"

#include <algorithm>

#include "core/error.h"

namespace trex::dsv4gpu {

namespace {

DevMem zeroed(size_t bytes) {
  DevMem m(bytes);
  if (bytes) TREX_CUDA(cudaMemsetAsync(m.as<char>(), 0, bytes, nullptr));
  return m;
}

}  // namespace

DecodeCaches::DecodeCaches(const std::vector<dsv4::AttentionDims>& dims, int64_t slots, int64_t max_context)
    : slots_(slots), max_context_(max_context) {
  TREX_CHECK(slots >= 1 && max_context >= 1, "decode caches: {} slots of {} tokens", slots, max_context);
  for (const dsv4::AttentionDims& D : dims) {
    DecodeLayerCache C;
    C.dims = D;
    const size_t S = size_t(slots), c = size_t(D.head_dim);
    if (D.type != dsv4::AttnType::Sliding) C.cap = max_context / D.ratio;
    C.keys = zeroed(S * size_t(C.cap + D.window) * c * sizeof(bf16));
    C.cmp = C.keys.as<bf16>();
    C.win = C.cmp + S * size_t(C.cap) * c;
    if (D.type != dsv4::AttnType::Sliding) {
      const bool csa = D.type == dsv4::AttnType::CSA;
      C.rows = (csa ? 2 : 1) * D.ratio;
      const size_t w = csa ? 2 : 1;
      C.ckv = zeroed(S * size_t(C.rows) * w * c * sizeof(bf16));
      C.cgate = zeroed(S * size_t(C.rows) * w * c * sizeof(bf16));
      if (csa) {
        const size_t cI = size_t(D.index_head_dim);
        C.ikeys = zeroed(S * size_t(std::max<int64_t>(C.cap, 1)) * cI * sizeof(bf16));
        C.ikv = zeroed(S * size_t(2 * D.ratio) * 2 * cI * sizeof(bf16));
        C.igate = zeroed(S * size_t(2 * D.ratio) * 2 * cI * sizeof(bf16));
      }
    }
    layers_.push_back(std::move(C));
  }
}

// Each slot owns a fixed region of every array: copy from's region (what it has written) over to's.
void DecodeCaches::copy_slot(int64_t from, int64_t to, int64_t L) {
  TREX_CHECK(from >= 0 && from < slots_ && to >= 0 && to < slots_ && from != to,
             "decode caches: cannot copy slot {} to slot {} (slots [0, {}))", from, to, slots_);
  auto copy = [&](void* base, int64_t per_slot, int64_t used) {  // bytes per slot, bytes to copy
    if (used <= 0) return;
    char* b = static_cast<char*>(base);
    TREX_CUDA(cudaMemcpyAsync(b + to * per_slot, b + from * per_slot, size_t(used), cudaMemcpyDeviceToDevice,
                              nullptr));
  };
  constexpr int64_t e = int64_t(sizeof(bf16));
  for (DecodeLayerCache& C : layers_) {
    const dsv4::AttentionDims& D = C.dims;
    const int64_t c = D.head_dim;
    copy(C.win, D.window * c * e, D.window * c * e);
    if (D.type == dsv4::AttnType::Sliding) continue;
    const bool csa = D.type == dsv4::AttnType::CSA;
    const int64_t w = csa ? 2 : 1, entries = std::min(L / D.ratio, C.cap);
    copy(C.cmp, C.cap * c * e, entries * c * e);
    copy(C.ckv.as<bf16>(), C.rows * w * c * e, C.rows * w * c * e);
    copy(C.cgate.as<bf16>(), C.rows * w * c * e, C.rows * w * c * e);
    if (!csa) continue;
    const int64_t cI = D.index_head_dim;
    copy(C.ikeys.as<bf16>(), std::max<int64_t>(C.cap, 1) * cI * e, entries * cI * e);
    copy(C.ikv.as<bf16>(), 2 * D.ratio * 2 * cI * e, 2 * D.ratio * 2 * cI * e);
    copy(C.igate.as<bf16>(), 2 * D.ratio * 2 * cI * e, 2 * D.ratio * 2 * cI * e);
  }
}

int64_t DecodeCaches::bytes(int64_t L) const {
  if (L == 0) return 0;
  int64_t b = 0;
  for (const DecodeLayerCache& C : layers_) {
    const dsv4::AttentionDims& D = C.dims;
    b += std::min(L, D.window) * D.head_dim;
    if (D.type == dsv4::AttnType::Sliding) continue;
    const bool csa = D.type == dsv4::AttnType::CSA;
    b += (L / D.ratio) * D.head_dim + 2 * C.rows * (csa ? 2 : 1) * D.head_dim;
    if (csa) b += (L / D.ratio) * D.index_head_dim + 2 * (2 * D.ratio) * 2 * D.index_head_dim;
  }
  return b * int64_t(sizeof(bf16));
}

}  // namespace trex::dsv4gpu
