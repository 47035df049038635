#include "model/dsv4/cpu_backend_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/attention_blas.h"
#include "model/dsv4/rope.h"

namespace trex::dsv4 {

namespace {

constexpr int64_t kParallelWork = int64_t(1) << 17;  // below this many scalar ops a loop stays serial

// Weighted (w non-null) or plain RMSNorm of rows, accumulated in T as the attention sub-layer does.
void rms_rows(const float* x, const float* w, float* y, int64_t rows, int64_t n, double eps) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* xi = x + i * n;
    float ss = 0;
    for (int64_t k = 0; k < n; ++k) ss += xi[k] * xi[k];
    const float r = 1.0f / std::sqrt(ss / float(n) + float(eps));
    for (int64_t k = 0; k < n; ++k) y[i * n + k] = (w ? w[k] : 1.0f) * (xi[k] * r);
  }
}

// cos / sin of every pair at one position, formed exactly like make_rope_table: fp32 angle, double trig.
void rope_at(const std::vector<float>& inv_freq, int64_t pos, float* cos, float* sin) {
  for (size_t k = 0; k < inv_freq.size(); ++k) {
    const float angle = inv_freq[k] * float(pos);
    cos[k] = float(std::cos(double(angle)));
    sin[k] = float(std::sin(double(angle)));
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t k = 0; k < n; ++k) s += a[k] * b[k];
  return s;
}

}  // namespace

CompressorStream::CompressorStream(int64_t m_, int64_t c_, int64_t rope_dim_, bool overlap_, double eps_,
                                   const float* norm_w_)
    : m(m_), c(c_), rope_dim(rope_dim_), overlap(overlap_), eps(eps_), norm_w(norm_w_) {
  const int64_t w = overlap ? 2 : 1;
  part_kv.assign(size_t(m * w * c), 0.f);
  part_gate.assign(size_t(m * w * c), 0.f);
  if (overlap) {
    prev_kv.assign(size_t(m * c), 0.f);
    prev_gate.assign(size_t(m * c), 0.f);
  }
}

int64_t CompressorStream::floats() const {
  return int64_t(part_kv.size() + part_gate.size() + prev_kv.size() + prev_gate.size()) + n_entries * c;
}

void CompressorStream::push(const float* kv, const float* gate, const float* ape, int64_t pos,
                            const std::vector<float>& inv_freq) {
  const int64_t stride = width() * c, o = pos % m;
  TREX_ASSERT(o == n_part);
  std::copy_n(kv, stride, part_kv.data() + o * stride);
  for (int64_t k = 0; k < stride; ++k) part_gate[size_t(o * stride + k)] = gate[k] + ape[o * stride + k];
  n_part = o + 1;
  if (n_part < m) return;
  emit(pos - (m - 1), inv_freq);
  if (overlap) {  // this window's "b" series feeds the next entry
    for (int64_t j = 0; j < m; ++j) {
      std::copy_n(part_kv.data() + j * stride, c, prev_kv.data() + j * c);
      std::copy_n(part_gate.data() + j * stride, c, prev_gate.data() + j * c);
    }
    has_prev = true;
  }
  n_part = 0;
}

// Pools the full partial window (+ previous window) into one entry at position first_pos. Candidate order and
// arithmetic follow compressor_forward: own rows first, then the previous window's.
void CompressorStream::emit(int64_t first_pos, const std::vector<float>& inv_freq) {
  const int64_t stride = width() * c, own = overlap ? c : 0;
  entries.resize(size_t((n_entries + 1) * c));
  float* y = entries.data() + n_entries * c;
  std::vector<float> pooled(size_t(c), 0.f);
  for (int64_t ch = 0; ch < c; ++ch) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < m; ++j) mx = std::max(mx, part_gate[size_t(j * stride + own + ch)]);
    if (has_prev)
      for (int64_t j = 0; j < m; ++j) mx = std::max(mx, prev_gate[size_t(j * c + ch)]);
    float sum = 0;
    for (int64_t j = 0; j < m; ++j) sum += std::exp(part_gate[size_t(j * stride + own + ch)] - mx);
    if (has_prev)
      for (int64_t j = 0; j < m; ++j) sum += std::exp(prev_gate[size_t(j * c + ch)] - mx);
    float acc = 0;
    for (int64_t j = 0; j < m; ++j)
      acc += std::exp(part_gate[size_t(j * stride + own + ch)] - mx) / sum *
             part_kv[size_t(j * stride + own + ch)];
    if (has_prev)
      for (int64_t j = 0; j < m; ++j)
        acc += std::exp(prev_gate[size_t(j * c + ch)] - mx) / sum * prev_kv[size_t(j * c + ch)];
    pooled[size_t(ch)] = acc;
  }
  norm_and_rope(pooled.data(), first_pos, inv_freq, y);
  ++n_entries;
}

void CompressorStream::norm_and_rope(const float* pooled, int64_t pos, const std::vector<float>& inv_freq,
                                     float* y) const {
  float ss = 0;
  for (int64_t ch = 0; ch < c; ++ch) ss += pooled[ch] * pooled[ch];
  const float rstd = 1.0f / std::sqrt(ss / float(c) + float(eps));
  for (int64_t ch = 0; ch < c; ++ch) y[ch] = norm_w[ch] * (pooled[ch] * rstd);
  const int64_t np = rope_dim / 2;
  std::vector<float> cs(static_cast<size_t>(np)), sn(static_cast<size_t>(np));
  rope_at(inv_freq, pos, cs.data(), sn.data());
  rope_rotate(y + c - rope_dim, cs.data(), sn.data(), np, +1);
}

LayerCacheCounts LayerCache::counts() const {
  LayerCacheCounts k;
  k.window_rows = n_win;
  k.floats = int64_t(ring.size());
  if (cmp) {
    k.compressed = cmp->n_entries;
    k.partial_rows = cmp->n_part;
    k.prev_rows = cmp->has_prev ? cmp->m : 0;
    k.floats += cmp->floats();
  }
  if (idx) {
    k.index_keys = idx->n_entries;
    k.index_partial_rows = idx->n_part;
    k.floats += idx->floats();
  }
  return k;
}

LayerCache new_layer_cache(const AttentionDims& D, const AttentionParamsT<float>& p) {
  LayerCache l;
  l.W = D.window, l.c = D.head_dim;
  l.ring.assign(size_t(D.window * D.head_dim), 0.f);
  if (D.type != AttnType::Sliding)
    l.cmp.emplace(D.ratio, D.head_dim, D.rope_dim, D.type == AttnType::CSA, D.eps, p.compressor.norm);
  if (D.type == AttnType::CSA)
    l.idx.emplace(D.ratio, D.index_head_dim, D.rope_dim, true, D.eps, p.indexer.compressor.norm);
  return l;
}

// Phase 1 compresses per sequence in token order, phase 2 attends per new token (independent), phase 3 moves the
// newest rows into the window rings.
void cached_attention_fwd(const AttentionDims& D, const AttentionParamsT<float>& p,
                          const std::vector<float>& inv_freq, const CachedTokens& tk, int64_t N,
                          const std::vector<LayerCache*>& caches, const float* a, float* out) {
  const int64_t H = D.n_heads, c = D.head_dim, r = D.rope_dim, np = r / 2, d = D.d;
  const int64_t hg = H / D.o_groups, gd = D.o_groups * D.o_rank, W = D.window;
  const bool compressed = D.type != AttnType::Sliding, csa = D.type == AttnType::CSA;

  // Rotary cos/sin of every new token.
  std::vector<float> cs(size_t(N * np)), sn(size_t(N * np));
  for (int64_t i = 0; i < N; ++i)
    rope_at(inv_freq, tk.pos[size_t(i)], cs.data() + i * np, sn.data() + i * np);

  // Query path (§2.4.1) and the shared K=V row (§2.4.2), batched over all new tokens.
  std::vector<float> qa(size_t(N * D.d_c)), cq(size_t(N * D.d_c)), q(size_t(N * H * c));
  cpu::linear_fwd_t<float>(qa.data(), a, p.wq_a, N, d, D.d_c);
  rms_rows(qa.data(), p.q_norm, cq.data(), N, D.d_c, D.eps);
  cpu::linear_fwd_t<float>(q.data(), cq.data(), p.wq_b, N, D.d_c, H * c);
  rms_rows(q.data(), nullptr, q.data(), N * H, c, D.eps);
  std::vector<float> kvp(size_t(N * c)), kv(size_t(N * c));
  cpu::linear_fwd_t<float>(kvp.data(), a, p.wkv, N, d, c);
  rms_rows(kvp.data(), p.kv_norm, kv.data(), N, c, D.eps);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t h = 0; h < H; ++h)
      rope_rotate(q.data() + (i * H + h) * c + c - r, cs.data() + i * np, sn.data() + i * np, np, +1);
    rope_rotate(kv.data() + i * c + c - r, cs.data() + i * np, sn.data() + i * np, np, +1);
  }

  // Compressor projections (and the indexer's queries, head weights and key projections).
  const int64_t cw = csa ? 2 * c : c;
  std::vector<float> ckv, cgate;
  if (compressed) {
    ckv.resize(size_t(N * cw)), cgate.resize(size_t(N * cw));
    cpu::linear_fwd_t<float>(ckv.data(), a, p.compressor.wkv, N, d, cw);
    cpu::linear_fwd_t<float>(cgate.data(), a, p.compressor.wgate, N, d, cw);
  }
  const int64_t nI = D.index_heads, cI = D.index_head_dim;
  std::vector<float> ikv, igate, iq, iw;
  if (csa) {
    ikv.resize(size_t(N * 2 * cI)), igate.resize(size_t(N * 2 * cI));
    cpu::linear_fwd_t<float>(ikv.data(), a, p.indexer.compressor.wkv, N, d, 2 * cI);
    cpu::linear_fwd_t<float>(igate.data(), a, p.indexer.compressor.wgate, N, d, 2 * cI);
    iq.resize(size_t(N * nI * cI)), iw.resize(size_t(N * nI));
    cpu::linear_fwd_t<float>(iq.data(), cq.data(), p.indexer.wq_b, N, D.d_c, nI * cI);
    cpu::linear_fwd_t<float>(iw.data(), a, p.indexer.weights_proj, N, d, nI);
    const float wscale = 1.0f / std::sqrt(float(nI));
    for (float& v : iw) v *= wscale;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t h = 0; h < nI; ++h)
        rope_rotate(iq.data() + (i * nI + h) * cI + cI - r, cs.data() + i * np, sn.data() + i * np, np, +1);
  }

  const int64_t n_items = tk.n_seqs;
  // Phase 1 (per sequence, in token order): compress. Entries are append-only, so afterwards every new
  // token's visible entries (the first floor((pos+1)/m)) are in place.
  if (compressed) {
#pragma omp parallel for schedule(dynamic, 1) if (n_items > 1 && N * cw * D.ratio > kParallelWork)
    for (int64_t it = 0; it < n_items; ++it) {
      LayerCache& S = *caches[size_t(it)];
      for (int64_t i = tk.seq_begin[size_t(it)]; i < tk.seq_begin[size_t(it + 1)]; ++i) {
        S.cmp->push(ckv.data() + i * cw, cgate.data() + i * cw, p.compressor.ape, tk.pos[size_t(i)],
                    inv_freq);
        if (csa)
          S.idx->push(ikv.data() + i * 2 * cI, igate.data() + i * 2 * cI, p.indexer.compressor.ape,
                      tk.pos[size_t(i)], inv_freq);
      }
    }
  }

  // Phase 2 (independent per new token): indexer top-k and the core attention with sink (§2.4.3).
  std::vector<float> o(size_t(N * H * c));
  const float scale = 1.0f / std::sqrt(float(c)), sscale = 1.0f / std::sqrt(float(cI));
  const int64_t k_sel = D.index_topk;
  const int64_t work = N * H * c * (W + (compressed ? (csa ? k_sel : tk.pos[N - 1] / D.ratio + 1) : 0));
#pragma omp parallel if (work > kParallelWork)
  {
    std::vector<const float*> keys;
    std::vector<float> z, score;
    std::vector<int64_t> order;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t it = tk.seq[size_t(i)], pos = tk.pos[size_t(i)];
      const LayerCache& S = *caches[size_t(it)];
      const int64_t first_new = tk.pos[size_t(tk.seq_begin[size_t(it)])];  // = the sequence's old length
      const int64_t i0 = tk.seq_begin[size_t(it)];
      keys.clear();
      // Window rows, oldest first: new rows from this step's kv, older ones from the ring (intact until
      // phase 3 writes the new rows).
      for (int64_t t = std::max<int64_t>(0, pos - W + 1); t <= pos; ++t)
        keys.push_back(t >= first_new ? kv.data() + (i0 + t - first_new) * c : S.ring.data() + (t % W) * c);
      if (compressed) {
        const int64_t n_vis = (pos + 1) / D.ratio;
        TREX_ASSERT(n_vis <= S.cmp->n_entries);
        if (!csa) {
          for (int64_t e = 0; e < n_vis; ++e) keys.push_back(S.cmp->entries.data() + e * c);
        } else {
          // Lightning indexer (§2.7): I[s] = sum_h w_h ReLU(q_h . K_s) / sqrt(c_I) over visible s.
          score.assign(size_t(n_vis), 0.f);
          const float* qi = iq.data() + i * nI * cI;
          for (int64_t s = 0; s < n_vis; ++s) {
            const float* key = S.idx->entries.data() + s * cI;
            float acc = 0;
            for (int64_t h = 0; h < nI; ++h) {
              const float u = dot(qi + h * cI, key, cI);
              acc += (iw[size_t(i * nI + h)] * sscale) * (u > 0.f ? u : 0.f);
            }
            score[size_t(s)] = acc;
          }
          order.resize(size_t(n_vis));
          std::iota(order.begin(), order.end(), int64_t(0));
          const int64_t n_take = std::min(k_sel, n_vis);
          std::partial_sort(order.begin(), order.begin() + n_take, order.end(), [&](int64_t x, int64_t y) {
            return score[size_t(x)] > score[size_t(y)] || (score[size_t(x)] == score[size_t(y)] && x < y);
          });
          for (int64_t s = 0; s < n_take; ++s) keys.push_back(S.cmp->entries.data() + order[size_t(s)] * c);
        }
      }
      z.resize(keys.size());
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = q.data() + (i * H + h) * c;
        float* oh = o.data() + (i * H + h) * c;
        float mx = p.attn_sink[h];
        for (size_t j = 0; j < keys.size(); ++j) {
          z[j] = dot(qh, keys[j], c) * scale;
          mx = std::max(mx, z[j]);
        }
        float sum = std::exp(p.attn_sink[h] - mx);
        for (size_t j = 0; j < keys.size(); ++j) {
          z[j] = std::exp(z[j] - mx);
          sum += z[j];
        }
        std::fill(oh, oh + c, 0.f);
        for (size_t j = 0; j < keys.size(); ++j) {
          const float pj = z[j] / sum;
          const float* kj = keys[j];
          for (int64_t k = 0; k < c; ++k) oh[k] += pj * kj[k];
        }
      }
    }
  }

  // Phase 3: the window ring takes the newest rows.
  for (int64_t it = 0; it < n_items; ++it) {
    LayerCache& S = *caches[size_t(it)];
    const int64_t b = tk.seq_begin[size_t(it)], e = tk.seq_begin[size_t(it + 1)];
    for (int64_t i = std::max(b, e - W); i < e; ++i)
      std::copy_n(kv.data() + i * c, c, S.ring.data() + (tk.pos[size_t(i)] % W) * c);
    S.n_win = std::min(W, tk.pos[size_t(e - 1)] + 1);
  }

  // Inverse RoPE and the grouped output projection (§2.4.5).
  for (int64_t i = 0; i < N; ++i)
    for (int64_t h = 0; h < H; ++h)
      rope_rotate(o.data() + (i * H + h) * c + c - r, cs.data() + i * np, sn.data() + i * np, np, -1);
  std::vector<float> rr(size_t(N * gd));
  for (int64_t gi = 0; gi < D.o_groups; ++gi)
    cpu::gemm_ld<float>(rr.data() + gi * D.o_rank, gd, o.data() + gi * hg * c, H * c,
                        p.wo_a + gi * D.o_rank * hg * c, hg * c, N, D.o_rank, hg * c, false, true, 1.0f,
                        0.0f);
  cpu::linear_fwd_t<float>(out, rr.data(), p.wo_b, N, gd, d);
}

}  // namespace trex::dsv4
