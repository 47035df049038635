#include "infer/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include "core/error.h"
#include "kernels/cpu/attention_blas.h"
#include "model/dsv4/embedding.h"
#include "model/dsv4/norm.h"

namespace trex::infer {

using namespace trex::dsv4;

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

// ------------------------------------------------------------------------------------------------
// Streaming compressor state (design §2.6): the rows of the window being filled and, for the overlapped
// CSA compressor, the previous window's "b" series; emits one entry per completed window.
// ------------------------------------------------------------------------------------------------
struct CompressorStream {
  int64_t m = 0, c = 0, rope_dim = 0;
  bool overlap = false;
  double eps = 1e-6;
  std::vector<float> part_kv, part_gate;  // [m, width*c]; gate already includes ape[offset]
  int64_t n_part = 0;
  std::vector<float> prev_kv, prev_gate;  // [m, c]: channels [0, c) of the previous window's rows
  bool has_prev = false;
  std::vector<float> entries;  // [E, c] normed, RoPE applied
  int64_t n_entries = 0;

  CompressorStream(int64_t m_, int64_t c_, int64_t rope_dim_, bool overlap_, double eps_)
      : m(m_), c(c_), rope_dim(rope_dim_), overlap(overlap_), eps(eps_) {
    const int64_t w = overlap ? 2 : 1;
    part_kv.assign(size_t(m * w * c), 0.f);
    part_gate.assign(size_t(m * w * c), 0.f);
    if (overlap) {
      prev_kv.assign(size_t(m * c), 0.f);
      prev_gate.assign(size_t(m * c), 0.f);
    }
  }
  int64_t width() const { return overlap ? 2 : 1; }
  int64_t floats() const {
    return int64_t(part_kv.size() + part_gate.size() + prev_kv.size() + prev_gate.size()) + n_entries * c;
  }

  // Consumes the projections of the token at `pos` (kv, gate rows of width*c); ape [m, width*c].
  void push(const float* kv, const float* gate, const float* ape, int64_t pos,
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

  // Pools the full partial window (+ previous window) into one entry at position first_pos. Candidate
  // order and arithmetic follow compressor_forward: own rows first, then the previous window's.
  void emit(int64_t first_pos, const std::vector<float>& inv_freq) {
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

  const float* norm_w = nullptr;  // [c], set by the owner
  void norm_and_rope(const float* pooled, int64_t pos, const std::vector<float>& inv_freq, float* y) const {
    float ss = 0;
    for (int64_t ch = 0; ch < c; ++ch) ss += pooled[ch] * pooled[ch];
    const float rstd = 1.0f / std::sqrt(ss / float(c) + float(eps));
    for (int64_t ch = 0; ch < c; ++ch) y[ch] = norm_w[ch] * (pooled[ch] * rstd);
    const int64_t np = rope_dim / 2;
    std::vector<float> cs(static_cast<size_t>(np)), sn(static_cast<size_t>(np));
    rope_at(inv_freq, pos, cs.data(), sn.data());
    rope_rotate(y + c - rope_dim, cs.data(), sn.data(), np, +1);
  }
};

struct SequenceCache::Layer {
  int64_t W = 0, c = 0;
  std::vector<float> ring;  // [W, c]: the K=V row of position p lives in slot p % W
  int64_t n_win = 0;
  std::unique_ptr<CompressorStream> cmp;  // CSA / HCA
  std::unique_ptr<CompressorStream> idx;  // CSA: the indexer's keys
};

SequenceCache::~SequenceCache() = default;

std::vector<LayerCacheCounts> SequenceCache::counts() const {
  std::vector<LayerCacheCounts> out;
  for (const auto& l : layers_) {
    LayerCacheCounts k;
    k.window_rows = l->n_win;
    k.floats = int64_t(l->ring.size());
    if (l->cmp) {
      k.compressed = l->cmp->n_entries;
      k.partial_rows = l->cmp->n_part;
      k.prev_rows = l->cmp->has_prev ? l->cmp->m : 0;
      k.floats += l->cmp->floats();
    }
    if (l->idx) {
      k.index_keys = l->idx->n_entries;
      k.index_partial_rows = l->idx->n_part;
      k.floats += l->idx->floats();
    }
    out.push_back(k);
  }
  return out;
}

int64_t SequenceCache::floats() const {
  int64_t n = 0;
  for (const auto& k : counts()) n += k.floats;
  return n;
}

// ------------------------------------------------------------------------------------------------
// What the decoder reads of one layer: pointers into the model's parameter table.
// ------------------------------------------------------------------------------------------------
struct Decoder::LayerView {
  AttentionDims dims;
  AttentionParamsT<float> ap;
  std::vector<float> inv_freq;  // fp32 copy of the layer's rotary frequencies
  const float *hc_attn_fn = nullptr, *hc_attn_base = nullptr, *hc_attn_scale = nullptr;
  const float *hc_ffn_fn = nullptr, *hc_ffn_base = nullptr, *hc_ffn_scale = nullptr;
  const float *attn_norm = nullptr, *ffn_norm = nullptr;
  MoeShape moe;
  MoeWeights<float> mw;
};

Decoder::Decoder(Model<float>& model, int64_t max_context)
    : model_(model), cfg_(model.config()), max_context_(max_context > 0 ? max_context : cfg_.max_position) {
  TREX_CHECK(max_context_ > 0, "decoder: no context limit (config max_position_embeddings is {}); pass one",
             cfg_.max_position);
  ParamTable<float>& P = model_.params();
  TREX_CHECK(P.allocated(), "decoder: the model's parameters are not allocated");
  for (int64_t l = 0; l < cfg_.n_layers; ++l) {
    auto v = std::make_unique<LayerView>();
    const std::string p = fmt::format("layers.{}.", l);
    v->dims = AttentionDims::from_config(cfg_, l);
    for (const auto& s : attention_param_specs(cfg_, l)) param_slot(v->ap, s.slot) = P.value(p + s.name);
    v->inv_freq.assign(v->dims.inv_freq.begin(), v->dims.inv_freq.end());
    v->hc_attn_fn = P.value(p + "hc_attn_fn"), v->hc_attn_base = P.value(p + "hc_attn_base");
    v->hc_attn_scale = P.value(p + "hc_attn_scale");
    v->hc_ffn_fn = P.value(p + "hc_ffn_fn"), v->hc_ffn_base = P.value(p + "hc_ffn_base");
    v->hc_ffn_scale = P.value(p + "hc_ffn_scale");
    v->attn_norm = P.value(p + "attn_norm.weight"), v->ffn_norm = P.value(p + "ffn_norm.weight");
    const bool hash = cfg_.mlp_types[size_t(l)] == MlpType::HashMoE;
    MoeShape& ms = v->moe;
    ms.d = cfg_.hidden, ms.n_experts = cfg_.n_routed_experts, ms.topk = cfg_.topk, ms.inter = cfg_.moe_inter;
    ms.shared_inter = cfg_.moe_inter * cfg_.n_shared_experts, ms.routed_scale = cfg_.routed_scale;
    ms.swiglu_limit = cfg_.swiglu_limit, ms.hash = hash;
    MoeWeights<float>& w = v->mw;
    w.gate = P.value(p + "ffn.gate.weight");
    // The model declares each expert family contiguously (w1 of all experts, then w3, then w2).
    auto family = [&](int k) {
      float* first = P.value(fmt::format("{}ffn.experts.0.w{}.weight", p, k));
      for (int64_t e = 1; e < ms.n_experts; ++e)
        TREX_CHECK(
            P.value(fmt::format("{}ffn.experts.{}.w{}.weight", p, e, k)) == first + e * ms.inter * ms.d,
            "decoder: expert weights w{} of layer {} are not contiguous in the parameter table", k, l);
      return first;
    };
    w.w1 = family(1), w.w3 = family(3), w.w2 = family(2);
    if (ms.shared_inter > 0) {
      w.sw1 = P.value(p + "ffn.shared_experts.w1.weight");
      w.sw3 = P.value(p + "ffn.shared_experts.w3.weight");
      w.sw2 = P.value(p + "ffn.shared_experts.w2.weight");
    }
    if (hash) {
      w.tid2eid = P.tid2eid.at(p + "ffn.gate.tid2eid").data();
      w.vocab = cfg_.vocab_size;
    } else {
      w.bias = P.bias.at(p + "ffn.gate.bias").data();
    }
    layers_.push_back(std::move(v));
  }
}

Decoder::~Decoder() = default;

std::unique_ptr<SequenceCache> Decoder::new_sequence() const {
  std::unique_ptr<SequenceCache> s(new SequenceCache());
  for (const auto& v : layers_) {
    auto l = std::make_unique<SequenceCache::Layer>();
    const AttentionDims& D = v->dims;
    l->W = D.window, l->c = D.head_dim;
    l->ring.assign(size_t(D.window * D.head_dim), 0.f);
    if (D.type != AttnType::Sliding) {
      l->cmp =
          std::make_unique<CompressorStream>(D.ratio, D.head_dim, D.rope_dim, D.type == AttnType::CSA, D.eps);
      l->cmp->norm_w = v->ap.compressor.norm;
    }
    if (D.type == AttnType::CSA) {
      l->idx = std::make_unique<CompressorStream>(D.ratio, D.index_head_dim, D.rope_dim, true, D.eps);
      l->idx->norm_w = v->ap.indexer.compressor.norm;
    }
    s->layers_.push_back(std::move(l));
  }
  return s;
}

// ------------------------------------------------------------------------------------------------
// One attention sub-layer over the step's new tokens.
// ------------------------------------------------------------------------------------------------
namespace {

struct StepTokens {
  int64_t N = 0;
  std::vector<int32_t> ids;
  std::vector<int64_t> pos;         // absolute position in its sequence
  std::vector<int64_t> item;        // index into the step's items
  std::vector<int64_t> item_begin;  // [items+1]: first new token of each item
};

void attention_step(const Decoder::LayerView& L, int64_t layer, const std::vector<StepItem>& items,
                    const std::vector<SequenceCache::Layer*>& caches, const StepTokens& tk, const float* a,
                    float* out) {
  const AttentionDims& D = L.dims;
  const AttentionParamsT<float>& p = L.ap;
  const int64_t N = tk.N, H = D.n_heads, c = D.head_dim, r = D.rope_dim, np = r / 2, d = D.d;
  const int64_t hg = H / D.o_groups, gd = D.o_groups * D.o_rank, W = D.window;
  const bool compressed = D.type != AttnType::Sliding, csa = D.type == AttnType::CSA;

  // Rotary cos/sin of every new token.
  std::vector<float> cs(size_t(N * np)), sn(size_t(N * np));
  for (int64_t i = 0; i < N; ++i)
    rope_at(L.inv_freq, tk.pos[size_t(i)], cs.data() + i * np, sn.data() + i * np);

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

  const int64_t n_items = int64_t(items.size());
  // Phase 1 (per sequence, in token order): compress. Entries are append-only, so afterwards every new
  // token's visible entries (the first floor((pos+1)/m)) are in place.
  if (compressed) {
#pragma omp parallel for schedule(dynamic, 1) if (n_items > 1 && N * cw * D.ratio > kParallelWork)
    for (int64_t it = 0; it < n_items; ++it) {
      SequenceCache::Layer& S = *caches[size_t(it)];
      for (int64_t i = tk.item_begin[size_t(it)]; i < tk.item_begin[size_t(it + 1)]; ++i) {
        S.cmp->push(ckv.data() + i * cw, cgate.data() + i * cw, p.compressor.ape, tk.pos[size_t(i)],
                    L.inv_freq);
        if (csa)
          S.idx->push(ikv.data() + i * 2 * cI, igate.data() + i * 2 * cI, p.indexer.compressor.ape,
                      tk.pos[size_t(i)], L.inv_freq);
      }
    }
  }

  // Phase 2 (independent per new token): indexer top-k and the core attention with sink (§2.4.3).
  std::vector<float> o(size_t(N * H * c));
  const float scale = 1.0f / std::sqrt(float(c)), sscale = 1.0f / std::sqrt(float(cI));
  const int64_t k_sel = D.index_topk;
  const int64_t work = N * H * c * (W + (compressed ? (csa ? k_sel : tk.pos.back() / D.ratio + 1) : 0));
#pragma omp parallel if (work > kParallelWork)
  {
    std::vector<const float*> keys;
    std::vector<float> z, score;
    std::vector<int64_t> order;
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t it = tk.item[size_t(i)], pos = tk.pos[size_t(i)];
      const SequenceCache::Layer& S = *caches[size_t(it)];
      const int64_t first_new = tk.pos[size_t(tk.item_begin[size_t(it)])];  // = the sequence's old length
      const int64_t i0 = tk.item_begin[size_t(it)];
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
    SequenceCache::Layer& S = *caches[size_t(it)];
    const int64_t b = tk.item_begin[size_t(it)], e = tk.item_begin[size_t(it + 1)];
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
  (void)layer;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// A step over all items.
// ------------------------------------------------------------------------------------------------
void Decoder::step(const std::vector<StepItem>& items, std::vector<float>& logits) {
  const int64_t V = cfg_.vocab_size, d = cfg_.hidden, hc = cfg_.hc_mult, M = (2 + hc) * hc;
  // Validate everything before any cache changes.
  StepTokens tk;
  std::set<const SequenceCache*> seen;
  tk.item_begin.push_back(0);
  for (size_t it = 0; it < items.size(); ++it) {
    const StepItem& x = items[it];
    TREX_CHECK(x.seq != nullptr, "decoder step: item {} has no sequence", it);
    TREX_CHECK(x.n >= 1 && x.ids != nullptr, "decoder step: item {} has no tokens", it);
    TREX_CHECK(seen.insert(x.seq).second, "decoder step: a sequence appears twice in one step (item {})", it);
    TREX_CHECK(x.seq->layers_.size() == layers_.size(), "decoder step: item {} belongs to another model", it);
    TREX_CHECK(x.seq->length_ + x.n <= max_context_,
               "decoder step: sequence of {} tokens + {} new would exceed the context limit of {} tokens",
               x.seq->length_, x.n, max_context_);
    for (int64_t j = 0; j < x.n; ++j) {
      TREX_CHECK(x.ids[j] >= 0 && x.ids[j] < V,
                 "decoder step: token id {} (item {}, token {}) outside [0, {})", x.ids[j], it, j, V);
      tk.ids.push_back(x.ids[j]);
      tk.pos.push_back(x.seq->length_ + j);
      tk.item.push_back(int64_t(it));
    }
    tk.item_begin.push_back(int64_t(tk.ids.size()));
  }
  tk.N = int64_t(tk.ids.size());
  logits.clear();
  if (tk.N == 0) return;
  const int64_t N = tk.N;

  ParamTable<float>& P = model_.params();
  std::vector<float> X(size_t(N * hc * d)), Xmid(size_t(N * hc * d)), col(size_t(N * d)), a(size_t(N * d)),
      rstd(static_cast<size_t>(N)), y(size_t(N * d));
  std::vector<float> mix(size_t(N * M)), mrstd(static_cast<size_t>(N)), pre(size_t(N * hc)),
      post(size_t(N * hc)), comb(size_t(N * hc * hc));
  MhcSiteActs<float> site{mix.data(), mrstd.data(), pre.data(), post.data(), comb.data()};
  MhcShape ms{N, hc, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
  embed_streams_fwd(tk.ids.data(), N, P.value("embed.weight"), V, d, hc, X.data());

  std::vector<SequenceCache::Layer*> caches(items.size());
  std::vector<float> moe_t;
  std::vector<int32_t> moe_i;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerView& L = *layers_[l];
    for (size_t it = 0; it < items.size(); ++it) caches[it] = items[it].seq->layers_[l].get();
    mhc_site_fwd(ms, X.data(), L.hc_attn_fn, L.hc_attn_base, L.hc_attn_scale, site, col.data());
    norm_fwd(col.data(), L.attn_norm, N, d, cfg_.rms_eps, a.data(), rstd.data());
    attention_step(L, int64_t(l), items, caches, tk, a.data(), y.data());
    mhc_expand_fwd(ms, X.data(), y.data(), post.data(), comb.data(), Xmid.data());
    mhc_site_fwd(ms, Xmid.data(), L.hc_ffn_fn, L.hc_ffn_base, L.hc_ffn_scale, site, col.data());
    norm_fwd(col.data(), L.ffn_norm, N, d, cfg_.rms_eps, a.data(), rstd.data());
    MoeShape mshape = L.moe;
    mshape.n_tok = N;
    const MoeActSizes sz = moe_act_sizes(mshape);
    moe_t.resize(size_t(sz.t_elems));
    moe_i.resize(size_t(sz.i32_elems));
    MoeActs<float> acts = moe_acts_bind(mshape, moe_t.data(), moe_i.data());
    moe_fwd(mshape, L.mw, a.data(), tk.ids.data(), acts, y.data());
    mhc_expand_fwd(ms, Xmid.data(), y.data(), post.data(), comb.data(), X.data());
  }
  for (const StepItem& x : items) x.seq->length_ += x.n;

  // Head on the rows whose logits were asked for.
  std::vector<int64_t> rows;
  for (size_t it = 0; it < items.size(); ++it) {
    const int64_t b = tk.item_begin[it], e = tk.item_begin[it + 1];
    for (int64_t i = items[it].all_logits ? b : e - 1; i < e; ++i) rows.push_back(i);
  }
  const int64_t R = int64_t(rows.size());
  std::vector<float> Xh(size_t(R * hc * d));
  for (int64_t k = 0; k < R; ++k)
    std::copy_n(X.data() + rows[size_t(k)] * hc * d, hc * d, Xh.data() + k * hc * d);
  std::vector<float> hbuf(size_t(head_act_elems(R, hc, d)));
  logits.assign(size_t(R * V), 0.f);
  HeadActs<float> ha = head_acts_bind(R, hc, d, hbuf.data(), logits.data());
  HeadParams<float> hp{P.value("hc_head_fn"), P.value("hc_head_base"), P.value("hc_head_scale"),
                       P.value("norm.weight"), P.value("head.weight")};
  MhcShape hs{R, hc, d, cfg_.hc_sinkhorn_iters, cfg_.hc_eps, cfg_.rms_eps};
  head_fwd(hs, V, Xh.data(), hp, ha);
}

void Decoder::step(SequenceCache& seq, const std::vector<int32_t>& ids, std::vector<float>& logits,
                   bool all_logits) {
  step({StepItem{&seq, ids.data(), int64_t(ids.size()), all_logits}}, logits);
}

}  // namespace trex::infer
