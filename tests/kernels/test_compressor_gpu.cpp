// The compressors' gated pooling on the GPU (compress_pool_fwd / _bwd, src/kernels/cuda/compressor.h) against a
// double-precision host reference of the same definition: per (entry, channel) a softmax over the candidates'
// logits gate + ape[offset] weighting their values; overlapped entries (CSA) add the previous window's tokens in
// channels [0, c) unless they open their document. Two packed documents with a trailing partial window, an
// overlapped ratio-4 case and a non-overlapped ratio-32 case (many candidates per entry).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cuda/compressor.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/gpu_test_util.h"

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

namespace {

void check_pool(int64_t ratio, int64_t c, bool overlap) {
  SCOPED_TRACE(testing::Message() << "ratio " << ratio << " c " << c << (overlap ? " overlapped" : ""));
  const int64_t docs[2] = {5 * ratio + 3, 4 * ratio + 1};  // tokens per document (each ends in a partial window)
  const int64_t N = docs[0] + docs[1], stride = (overlap ? 2 : 1) * c;
  std::vector<int32_t> first, doc_index;
  for (int64_t d = 0, t0 = 0; d < 2; t0 += docs[d], ++d)
    for (int64_t w = 0; (w + 1) * ratio <= docs[d]; ++w) {
      first.push_back(int32_t(t0 + w * ratio));
      doc_index.push_back(int32_t(w));
    }
  const int64_t E = int64_t(first.size());
  auto kv = random_bf16(size_t(N * stride), 61), gate = random_bf16(size_t(N * stride), 62, 2.f);
  auto dpooled = random_bf16(size_t(E * c), 63);
  const std::vector<float> ape = random_f32(size_t(ratio * stride), 64, 0.5f);
  const std::vector<float> dape0 = random_f32(size_t(ratio * stride), 65);

  // Reference.
  std::vector<float> pooled(static_cast<size_t>(E * c)), dkv(static_cast<size_t>(N * stride), 0.f);
  std::vector<float> dgate(static_cast<size_t>(N * stride), 0.f), dape = dape0;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t ch = 0; ch < c; ++ch) {
      struct C {
        int64_t idx, ape_idx;
      };
      std::vector<C> cs;
      for (int64_t j = 0; j < ratio; ++j)
        cs.push_back({(first[size_t(e)] + j) * stride + (overlap ? c : 0) + ch, j * stride + (overlap ? c : 0) + ch});
      if (overlap && doc_index[size_t(e)] > 0)
        for (int64_t j = 0; j < ratio; ++j)
          cs.push_back({(first[size_t(e)] - ratio + j) * stride + ch, j * stride + ch});
      double mx = -INFINITY;
      for (const C& q : cs) mx = std::max(mx, double(gate.values[size_t(q.idx)]) + ape[size_t(q.ape_idx)]);
      double sum = 0, acc = 0;
      for (const C& q : cs) {
        const double w = std::exp(double(gate.values[size_t(q.idx)]) + ape[size_t(q.ape_idx)] - mx);
        sum += w, acc += w * kv.values[size_t(q.idx)];
      }
      const double p = acc / sum, dp = dpooled.values[size_t(e * c + ch)];
      pooled[size_t(e * c + ch)] = float(p);
      for (const C& q : cs) {
        const double w = std::exp(double(gate.values[size_t(q.idx)]) + ape[size_t(q.ape_idx)] - mx) / sum;
        dkv[size_t(q.idx)] = float(w * dp);
        dgate[size_t(q.idx)] = float(w * (kv.values[size_t(q.idx)] - p) * dp);
        dape[size_t(q.ape_idx)] += float(w * (kv.values[size_t(q.idx)] - p) * dp);
      }
    }

  auto g_first = DeviceBuffer::from_host(first), g_doc = DeviceBuffer::from_host(doc_index);
  auto g_kv = DeviceBuffer::from_host(kv.bits), g_gate = DeviceBuffer::from_host(gate.bits);
  auto g_dp = DeviceBuffer::from_host(dpooled.bits), g_ape = DeviceBuffer::from_host(ape);
  auto g_dape = DeviceBuffer::from_host(dape0);
  auto g_pooled = poisoned<uint16_t>(size_t(E * c));
  auto g_dkv = zeroed<uint16_t>(size_t(N * stride)), g_dgate = zeroed<uint16_t>(size_t(N * stride));
  trex::cuda::CompressArgs a;
  a.n_entries = E, a.ratio = ratio, a.c = c, a.overlap = overlap;
  a.entry_first = g_first.as<int32_t>(), a.entry_doc_index = g_doc.as<int32_t>();
  trex::cuda::compress_pool_fwd(g_pooled.as<bf16>(), g_kv.as<bf16>(), g_gate.as<bf16>(), g_ape.as<float>(), a);
  trex::cuda::compress_pool_bwd(g_dkv.as<bf16>(), g_dgate.as<bf16>(), g_dape.as<float>(), g_dp.as<bf16>(),
                                g_kv.as<bf16>(), g_gate.as<bf16>(), g_ape.as<float>(), a);
  TREX_CUDA(cudaDeviceSynchronize());
  EXPECT_LT(rel_err(to_f32(g_pooled.to_host<uint16_t>()), pooled), 4e-3);
  EXPECT_LT(rel_err(to_f32(g_dkv.to_host<uint16_t>()), dkv), 4e-3);
  EXPECT_LT(rel_err(to_f32(g_dgate.to_host<uint16_t>()), dgate), 4e-3);
  // dape accumulates onto its initial value; compare the increments.
  std::vector<float> got = g_dape.to_host<float>(), inc(dape.size()), ginc(dape.size());
  for (size_t i = 0; i < dape.size(); ++i) inc[i] = dape[i] - dape0[i], ginc[i] = got[i] - dape0[i];
  EXPECT_LT(rel_err(ginc, inc), 5e-3);
}

}  // namespace

TEST(GpuCompressor, OverlappedPoolingMatchesReference) { check_pool(4, 80, true); }

TEST(GpuCompressor, ManyCandidatePoolingMatchesReference) {
  check_pool(32, 72, false);  // c not a multiple of 32: a partial channel block
  check_pool(32, 64, true);
}
