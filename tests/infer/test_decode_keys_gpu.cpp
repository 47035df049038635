// The engine's tensor-core attention path (decode_key_sets + the training kernel sparse_attention_fwd over the
// step's kv rows and the layer's combined [entries | window rings] key array) against the per-warp decode kernel
// (decode_attention, one key per iteration: the reference the CPU-matching host test of test_gpu_engine_gpu.cpp
// pins down) on one random mixed step: a prompt chunk longer than the window on an empty slot, a decoded token
// deep into its sequence, a short chunk on a short history and a chunk that starts mid-window; sliding, HCA-like
// (entries by range) and CSA-like (indexer selections, best first with -1 trailing, fewer valid than k) calls;
// heads / head dim of the tiny test model (8 x 256) and of flash-l4 (64 x 512).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "core/dtype.h"
#include "kernels/cuda/attention_sparse.h"
#include "kernels/cuda/decode_attention.h"

namespace {

using namespace trex;

template <typename T>
T* upload(const std::vector<T>& h) {
  void* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(h.size(), 1) * sizeof(T)), cudaSuccess);
  if (!h.empty()) {
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return static_cast<T*>(d);
}

std::vector<float> download_bf16(const cuda::bf16* d, size_t n) {
  std::vector<uint16_t> b(n);
  EXPECT_EQ(cudaMemcpy(b.data(), d, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> f(n);
  for (size_t k = 0; k < n; ++k) f[k] = bf16_to_f32(b[k]);
  return f;
}

struct Item {
  int32_t slot, first, n;
};

void check_against_decode_kernel(int64_t H, int64_t c) {
  const int64_t W = 16, ratio = 4, S = 5, cap = 64, k_sel = 12;
  const std::vector<Item> items = {{2, 0, 23}, {0, 150, 1}, {4, 5, 3}, {1, 40, 9}, {3, 9, 1}};
  std::vector<int32_t> pos, item, islot, first, ibegin = {0};
  int64_t n_hist = 0, max_vis = 0;
  for (size_t it = 0; it < items.size(); ++it) {
    const Item& x = items[it];
    for (int32_t j = 0; j < x.n; ++j) pos.push_back(x.first + j), item.push_back(int32_t(it));
    islot.push_back(x.slot), first.push_back(x.first), ibegin.push_back(int32_t(pos.size()));
    n_hist = std::max<int64_t>(n_hist, std::min<int64_t>(x.first, W - 1));
    max_vis = std::max<int64_t>(max_vis, (x.first + x.n) / ratio);
  }
  ASSERT_LE(max_vis, cap);
  const int64_t N = int64_t(pos.size()), I = int64_t(items.size());
  std::mt19937 g(uint32_t(H * 1000 + c));
  std::normal_distribution<float> nd(0.f, 1.f);
  auto rnd_bf16 = [&](int64_t n) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (uint16_t& x : v) x = f32_to_bf16(nd(g));
    return v;
  };
  // CSA selections: distinct visible entries of the token's slot in random order, then -1 (some tokens see
  // fewer than k_sel entries).
  std::vector<int64_t> sel(static_cast<size_t>(N * k_sel), -1);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t slot = islot[size_t(item[size_t(i)])], vis = (pos[size_t(i)] + 1) / ratio;
    std::vector<int64_t> e(static_cast<size_t>(vis));
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), g);
    for (int64_t k = 0; k < std::min(vis, k_sel); ++k) sel[size_t(i * k_sel + k)] = slot * cap + e[size_t(k)];
  }
  std::vector<float> sink_h(static_cast<size_t>(H));
  for (float& x : sink_h) x = nd(g);
  auto* q = reinterpret_cast<cuda::bf16*>(upload(rnd_bf16(N * H * c)));
  auto* kv = reinterpret_cast<cuda::bf16*>(upload(rnd_bf16(N * c)));
  auto* keys = reinterpret_cast<cuda::bf16*>(upload(rnd_bf16((S * cap + S * W) * c)));  // [entries | rings]
  float* sink = upload(sink_h);
  int64_t* dsel = upload(sel);
  cuda::DecodeStep st;
  st.n_tok = N, st.n_items = I;
  st.tok_pos = upload(pos), st.tok_item = upload(item), st.item_slot = upload(islot), st.item_first = upload(first);
  st.item_begin = upload(ibegin);
  cuda::bf16 *o_ref = nullptr, *o_mma = nullptr;
  float* lse = nullptr;
  int64_t *win_begin = nullptr, *cols = nullptr;
  ASSERT_EQ(cudaMalloc(&o_ref, size_t(N * H * c) * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&o_mma, size_t(N * H * c) * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&lse, size_t(N * H) * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&win_begin, size_t(N) * 8), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&cols, size_t(N * (W + k_sel + cap)) * 8), cudaSuccess);

  for (int mode = 0; mode < 3; ++mode) {  // sliding, HCA (range), CSA (selection)
    cuda::DecodeAttention da;
    da.heads = H, da.c = c, da.scale = float(1.0 / std::sqrt(double(c))), da.q = q, da.kv = kv;
    da.win = keys + S * cap * c, da.window = W;
    if (mode >= 1) da.cmp = keys, da.cap = cap, da.ratio = ratio;
    if (mode == 2) da.sel = dsel, da.k_sel = k_sel;
    da.sink = sink, da.o = o_ref, da.keys_per_iter = 1;
    cuda::decode_attention(st, da);

    cuda::DecodeKeySets ks;
    ks.window = W, ks.ring_base = S * cap, ks.n_hist = n_hist;
    if (mode >= 1) ks.n_cmp = mode == 2 ? std::min(k_sel, max_vis) : max_vis, ks.cap = cap, ks.ratio = ratio;
    if (mode == 2) ks.sel = dsel, ks.k_sel = k_sel;
    ks.win_begin = win_begin, ks.cols = cols;
    cuda::decode_key_sets(st, ks);
    cuda::SparseKeySets sk;
    sk.win_begin = win_begin;
    const int64_t n_cols = ks.n_hist + ks.n_cmp;
    if (n_cols > 0) sk.cmp_sel = cols, sk.k_sel = n_cols;
    cuda::sparse_attention_fwd(q, kv, keys, sink, N, H, c, sk, o_mma, lse);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    // The window of token i must end at its own row and start inside its item's rows of the step.
    std::vector<int64_t> wb(static_cast<size_t>(N));
    ASSERT_EQ(cudaMemcpy(wb.data(), win_begin, size_t(N) * 8, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t it = item[size_t(i)], p = pos[size_t(i)];
      const int64_t want = ibegin[size_t(it)] + std::max<int64_t>(first[size_t(it)], p - W + 1) - first[size_t(it)];
      EXPECT_EQ(wb[size_t(i)], want) << "token " << i;
    }
    const std::vector<float> ref = download_bf16(o_ref, size_t(N * H * c));
    const std::vector<float> got = download_bf16(o_mma, size_t(N * H * c));
    double err = 0, mag = 0, sum_err = 0;
    for (size_t k = 0; k < ref.size(); ++k) {
      const double e = std::abs(double(got[k]) - double(ref[k]));
      err = std::max(err, e), sum_err += e;
      mag = std::max(mag, double(std::abs(ref[k])));
    }
    std::printf("  H %lld c %lld mode %s: tensor-core vs decode kernel max |diff| %.5f (max |o| %.3f), mean %.6f\n",
                (long long)H, (long long)c, mode == 0 ? "sliding" : mode == 1 ? "HCA" : "CSA", err, mag,
                sum_err / double(ref.size()));
    // bf16 outputs and bf16 probabilities in the tensor-core PV product: a few bf16 ulps of the output scale.
    EXPECT_LT(err, 2e-2 * mag) << "H " << H << " c " << c << " mode " << mode;
    EXPECT_LT(sum_err / double(ref.size()), 2e-3 * mag) << "H " << H << " c " << c << " mode " << mode;
  }
  for (const void* d : {static_cast<const void*>(q), static_cast<const void*>(kv), static_cast<const void*>(keys),
                        static_cast<const void*>(sink), static_cast<const void*>(dsel),
                        static_cast<const void*>(st.tok_pos), static_cast<const void*>(st.tok_item),
                        static_cast<const void*>(st.item_slot), static_cast<const void*>(st.item_first),
                        static_cast<const void*>(st.item_begin), static_cast<const void*>(o_ref),
                        static_cast<const void*>(o_mma), static_cast<const void*>(lse),
                        static_cast<const void*>(win_begin), static_cast<const void*>(cols)})
    cudaFree(const_cast<void*>(d));
}

TEST(DecodeKeySets, TensorCoreAttentionMatchesDecodeKernelTinyShape) { check_against_decode_kernel(8, 256); }

TEST(DecodeKeySets, TensorCoreAttentionMatchesDecodeKernelFlashShape) { check_against_decode_kernel(64, 512); }

}  // namespace
