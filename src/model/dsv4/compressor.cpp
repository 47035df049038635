#include "model/dsv4/compressor.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/cpu/attention_blas.h"

namespace trex::dsv4 {

CompressPlan make_compress_plan(const SeqLayout& layout, int64_t ratio) {
  TREX_CHECK(ratio > 0, "make_compress_plan: compress ratio {} must be positive", ratio);
  const int64_t B = layout.B, T = layout.T, N = B * T;
  CompressPlan plan;
  plan.ratio = ratio;
  plan.row_entry_begin.assign(size_t(B + 1), 0);
  plan.tok_entry.assign(size_t(N), -1);
  plan.vis_begin.assign(size_t(N), 0);
  plan.vis_end.assign(size_t(N), 0);
  for (int64_t b = 0; b < B; ++b) {
    plan.row_entry_begin[size_t(b)] = int64_t(plan.entry_first.size());
    int64_t s = 0;
    while (s < T) {
      int64_t e = s + 1;  // one past the document's last token
      while (e < T && layout.doc_start[size_t(b * T + e)] == s) ++e;
      const int64_t n_win = (e - s) / ratio, doc_entry0 = int64_t(plan.entry_first.size());
      for (int64_t w = 0; w < n_win; ++w) {
        const int64_t first = b * T + s + w * ratio;
        for (int64_t j = 0; j < ratio; ++j) plan.tok_entry[size_t(first + j)] = doc_entry0 + w;
        plan.entry_first.push_back(first);
        plan.entry_doc_index.push_back(w);
      }
      for (int64_t t = s; t < e; ++t) {
        const int64_t n_vis = (t - s + 1) / ratio;  // entries whose whole window lies at or before t
        plan.vis_begin[size_t(b * T + t)] = doc_entry0;
        plan.vis_end[size_t(b * T + t)] = doc_entry0 + n_vis;
      }
      s = e;
    }
  }
  plan.row_entry_begin[size_t(B)] = int64_t(plan.entry_first.size());
  plan.n_entries = int64_t(plan.entry_first.size());
  return plan;
}

namespace {

constexpr int64_t kParallelWork = int64_t(1) << 17;  // smaller loops stay on one thread

// Visits the candidates of entry e: fn(token, ape_offset, channel_offset) for the window's own
// tokens and, for the overlapped compressor, the previous window of the same document.
template <typename Fn>
void for_each_candidate(const CompressPlan& plan, int64_t e, bool overlap, int64_t c, Fn&& fn) {
  const int64_t m = plan.ratio, first = plan.entry_first[size_t(e)];
  const int64_t own_off = overlap ? c : 0;
  for (int64_t j = 0; j < m; ++j) fn(first + j, j, own_off);
  if (overlap && plan.entry_doc_index[size_t(e)] > 0)
    for (int64_t j = 0; j < m; ++j) fn(first - m + j, j, int64_t(0));
}

// Per-channel max and sum of exp of the candidate logits of entry e.
template <typename T>
void softmax_stats(const CompressPlan& plan, int64_t e, bool overlap, int64_t c, const T* gate, const T* ape,
                   T* mx, T* sum) {
  const int64_t stride = (overlap ? 2 : 1) * c;
  for (int64_t ch = 0; ch < c; ++ch) {
    mx[ch] = -std::numeric_limits<T>::infinity();
    sum[ch] = 0;
  }
  for_each_candidate(plan, e, overlap, c, [&](int64_t j, int64_t o, int64_t off) {
    const T* g = gate + j * stride + off;
    const T* b = ape + o * stride + off;
    for (int64_t ch = 0; ch < c; ++ch) mx[ch] = std::max(mx[ch], g[ch] + b[ch]);
  });
  for_each_candidate(plan, e, overlap, c, [&](int64_t j, int64_t o, int64_t off) {
    const T* g = gate + j * stride + off;
    const T* b = ape + o * stride + off;
    for (int64_t ch = 0; ch < c; ++ch) sum[ch] += std::exp(g[ch] + b[ch] - mx[ch]);
  });
}

}  // namespace

template <typename T>
void compressor_forward(const CompressorParamsT<T>& p, const CompressorDims& dims, const CompressPlan& plan,
                        const SeqLayout& layout, const RopeTable<T>& rope, const T* a, T* out,
                        CompressorSaved<T>& saved) {
  const int64_t N = layout.n_tokens(), c = dims.c, width = dims.overlap ? 2 : 1, stride = width * c;
  const int64_t E = plan.n_entries, n_pairs = dims.rope_dim / 2;
  saved.kv.resize(size_t(N * stride));
  saved.gate.resize(size_t(N * stride));
  saved.pooled.resize(size_t(E * c));
  saved.rstd.resize(static_cast<size_t>(E));
  cpu::linear_fwd_t<T>(saved.kv.data(), a, p.wkv, N, dims.d, stride);
  cpu::linear_fwd_t<T>(saved.gate.data(), a, p.wgate, N, dims.d, stride);
  const T* kv = saved.kv.data();
  const T* gate = saved.gate.data();
#pragma omp parallel if (E * c * 2 * plan.ratio > kParallelWork)
  {
    std::vector<T> mx(static_cast<size_t>(c)), sum(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t e = 0; e < E; ++e) {
      softmax_stats(plan, e, dims.overlap, c, gate, p.ape, mx.data(), sum.data());
      T* pooled = saved.pooled.data() + e * c;
      for (int64_t ch = 0; ch < c; ++ch) pooled[ch] = 0;
      for_each_candidate(plan, e, dims.overlap, c, [&](int64_t j, int64_t o, int64_t off) {
        const T* g = gate + j * stride + off;
        const T* b = p.ape + o * stride + off;
        const T* v = kv + j * stride + off;
        for (int64_t ch = 0; ch < c; ++ch) pooled[ch] += std::exp(g[ch] + b[ch] - mx[ch]) / sum[ch] * v[ch];
      });
      T ss = 0;
      for (int64_t ch = 0; ch < c; ++ch) ss += pooled[ch] * pooled[ch];
      const T rstd = T(1) / std::sqrt(ss / T(c) + T(dims.eps));
      saved.rstd[size_t(e)] = rstd;
      T* y = out + e * c;
      for (int64_t ch = 0; ch < c; ++ch) y[ch] = p.norm[ch] * (pooled[ch] * rstd);
      const int64_t pos = layout.pos[size_t(plan.entry_first[size_t(e)])];
      rope_rotate(y + c - dims.rope_dim, rope.cos_at(pos), rope.sin_at(pos), n_pairs, +1);
    }
  }
}

template <typename T>
void compressor_backward(const CompressorParamsT<T>& p, const CompressorParamsT<T>& g,
                         const CompressorDims& dims, const CompressPlan& plan, const SeqLayout& layout,
                         const RopeTable<T>& rope, const T* a, const CompressorSaved<T>& saved, const T* dout,
                         T* da) {
  const int64_t N = layout.n_tokens(), c = dims.c, width = dims.overlap ? 2 : 1, stride = width * c;
  const int64_t E = plan.n_entries, n_pairs = dims.rope_dim / 2, m = plan.ratio;
  if (E == 0) return;
  // Through RoPE (rotate back) and the weighted RMSNorm: dpooled [E, c].
  std::vector<T> dpooled(size_t(E * c));
  std::vector<T> dy(static_cast<size_t>(c));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t ch = 0; ch < c; ++ch) dy[size_t(ch)] = dout[e * c + ch];
    const int64_t pos = layout.pos[size_t(plan.entry_first[size_t(e)])];
    rope_rotate(dy.data() + c - dims.rope_dim, rope.cos_at(pos), rope.sin_at(pos), n_pairs, -1);
    const T* x = saved.pooled.data() + e * c;
    const T rstd = saved.rstd[size_t(e)];
    T dot = 0;
    for (int64_t ch = 0; ch < c; ++ch) {
      const T xhat = x[ch] * rstd;
      if (g.norm) g.norm[ch] += dy[size_t(ch)] * xhat;
      dot += dy[size_t(ch)] * p.norm[ch] * xhat;
    }
    dot /= T(c);
    for (int64_t ch = 0; ch < c; ++ch)
      dpooled[size_t(e * c + ch)] = rstd * (dy[size_t(ch)] * p.norm[ch] - x[ch] * rstd * dot);
  }
  // Through the gated pooling. Every (token, channel half) feeds exactly one entry, so entries write
  // disjoint parts of dkv / dgate and can run in parallel.
  std::vector<T> dkv(size_t(N * stride), T(0)), dgate(size_t(N * stride), T(0));
  const T* kv = saved.kv.data();
  const T* gate = saved.gate.data();
#pragma omp parallel if (E * c * 2 * plan.ratio > kParallelWork)
  {
    std::vector<T> mx(static_cast<size_t>(c)), sum(static_cast<size_t>(c));
#pragma omp for schedule(static)
    for (int64_t e = 0; e < E; ++e) {
      softmax_stats(plan, e, dims.overlap, c, gate, p.ape, mx.data(), sum.data());
      const T* pooled = saved.pooled.data() + e * c;
      const T* dp = dpooled.data() + e * c;
      for_each_candidate(plan, e, dims.overlap, c, [&](int64_t j, int64_t o, int64_t off) {
        const T* gj = gate + j * stride + off;
        const T* b = p.ape + o * stride + off;
        const T* v = kv + j * stride + off;
        T* dv = dkv.data() + j * stride + off;
        T* dz = dgate.data() + j * stride + off;
        for (int64_t ch = 0; ch < c; ++ch) {
          const T w = std::exp(gj[ch] + b[ch] - mx[ch]) / sum[ch];
          dv[ch] = w * dp[ch];
          dz[ch] = w * (v[ch] - pooled[ch]) * dp[ch];
        }
      });
    }
  }
  // ape: every token of a complete window used ape[its offset] in both channel halves.
  if (g.ape)
    for (int64_t e = 0; e < E; ++e) {
      const int64_t first = plan.entry_first[size_t(e)];
      for (int64_t j = 0; j < m; ++j) {
        const T* dz = dgate.data() + (first + j) * stride;
        T* dape = g.ape + j * stride;
        for (int64_t k = 0; k < stride; ++k) dape[k] += dz[k];
      }
    }
  cpu::linear_bwd_t<T>(da, g.wkv, dkv.data(), a, p.wkv, N, dims.d, stride);
  cpu::linear_bwd_t<T>(da, g.wgate, dgate.data(), a, p.wgate, N, dims.d, stride);
}

template void compressor_forward<float>(const CompressorParamsT<float>&, const CompressorDims&,
                                        const CompressPlan&, const SeqLayout&, const RopeTable<float>&,
                                        const float*, float*, CompressorSaved<float>&);
template void compressor_forward<double>(const CompressorParamsT<double>&, const CompressorDims&,
                                         const CompressPlan&, const SeqLayout&, const RopeTable<double>&,
                                         const double*, double*, CompressorSaved<double>&);
template void compressor_backward<float>(const CompressorParamsT<float>&, const CompressorParamsT<float>&,
                                         const CompressorDims&, const CompressPlan&, const SeqLayout&,
                                         const RopeTable<float>&, const float*, const CompressorSaved<float>&,
                                         const float*, float*);
template void compressor_backward<double>(const CompressorParamsT<double>&, const CompressorParamsT<double>&,
                                          const CompressorDims&, const CompressPlan&, const SeqLayout&,
                                          const RopeTable<double>&, const double*,
                                          const CompressorSaved<double>&, const double*, double*);

}  // namespace trex::dsv4
