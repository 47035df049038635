#include "model/dsv4/attention.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/attention_blas.h"
#include "kernels/cpu/attention_sparse.h"

namespace trex::dsv4 {

// ------------------------------------------------------------------------------------------------
// Parameter table
// ------------------------------------------------------------------------------------------------

AttentionDims AttentionDims::from_config(const ModelConfig& cfg, int64_t layer) {
  TREX_CHECK(
      layer >= 0 && layer < int64_t(cfg.attn_types.size()) && layer < int64_t(cfg.compress_ratio.size()),
      "attention: layer {} out of range (config has {} attention layer types)", layer, cfg.attn_types.size());
  AttentionDims d;
  d.d = cfg.hidden;
  d.d_c = cfg.q_lora_rank;
  d.n_heads = cfg.n_heads;
  d.head_dim = cfg.head_dim;
  d.rope_dim = cfg.rope_dim;
  d.o_groups = cfg.o_groups;
  d.o_rank = cfg.o_lora_rank;
  d.window = cfg.window;
  d.type = cfg.attn_types[size_t(layer)];
  d.ratio = cfg.compress_ratio[size_t(layer)];
  d.index_heads = cfg.index_n_heads;
  d.index_head_dim = cfg.index_head_dim;
  d.index_topk = cfg.index_topk;
  d.eps = cfg.rms_eps;
  TREX_CHECK(
      d.d > 0 && d.d_c > 0 && d.n_heads > 0 && d.head_dim > 0 && d.window > 0,
      "attention layer {}: hidden {}, q_lora_rank {}, heads {}, head_dim {}, window {} must be positive",
      layer, d.d, d.d_c, d.n_heads, d.head_dim, d.window);
  TREX_CHECK(d.rope_dim > 0 && d.rope_dim % 2 == 0 && d.rope_dim <= d.head_dim,
             "attention layer {}: rope_dim {} must be even and in (0, head_dim {}]", layer, d.rope_dim,
             d.head_dim);
  TREX_CHECK(d.o_groups > 0 && d.n_heads % d.o_groups == 0 && d.o_rank > 0,
             "attention layer {}: o_groups {} must divide the {} heads (o_lora_rank {})", layer, d.o_groups,
             d.n_heads, d.o_rank);
  TREX_CHECK((d.type == AttnType::Sliding) == (d.ratio == 0),
             "attention layer {}: compress ratio {} does not match the layer type (sliding layers have 0)",
             layer, d.ratio);
  TREX_CHECK(d.ratio >= 0, "attention layer {}: negative compress ratio {}", layer, d.ratio);
  if (d.type == AttnType::CSA)
    TREX_CHECK(
        d.index_heads > 0 && d.index_head_dim >= d.rope_dim && d.index_topk > 0,
        "attention layer {} (CSA): index_n_heads {}, index_head_dim {} (>= rope_dim {}), index_topk {}",
        layer, d.index_heads, d.index_head_dim, d.rope_dim, d.index_topk);
  d.inv_freq = rope_inv_freq(cfg.rope_for(layer), d.rope_dim);
  return d;
}

std::vector<AttentionParamSpec> attention_param_specs(const ModelConfig& cfg, int64_t layer) {
  const AttentionDims D = AttentionDims::from_config(cfg, layer);
  const int64_t c = D.head_dim, H = D.n_heads;
  std::vector<AttentionParamSpec> s = {
      {"attn.wq_a.weight", {D.d_c, D.d}, AttnParam::wq_a},
      {"attn.q_norm.weight", {D.d_c}, AttnParam::q_norm},
      {"attn.wq_b.weight", {H * c, D.d_c}, AttnParam::wq_b},
      {"attn.wkv.weight", {c, D.d}, AttnParam::wkv},
      {"attn.kv_norm.weight", {c}, AttnParam::kv_norm},
      {"attn.wo_a.weight", {D.o_groups * D.o_rank, H / D.o_groups * c}, AttnParam::wo_a},
      {"attn.wo_b.weight", {D.d, D.o_groups * D.o_rank}, AttnParam::wo_b},
      {"attn.attn_sink", {H}, AttnParam::attn_sink},
  };
  if (D.type == AttnType::Sliding) return s;
  const int64_t w = D.type == AttnType::CSA ? 2 : 1;
  s.push_back({"attn.compressor.wkv.weight", {w * c, D.d}, AttnParam::cmp_wkv});
  s.push_back({"attn.compressor.wgate.weight", {w * c, D.d}, AttnParam::cmp_wgate});
  s.push_back({"attn.compressor.ape", {D.ratio, w * c}, AttnParam::cmp_ape});
  s.push_back({"attn.compressor.norm.weight", {c}, AttnParam::cmp_norm});
  if (D.type != AttnType::CSA) return s;
  const int64_t nI = D.index_heads, cI = D.index_head_dim;
  s.push_back({"attn.indexer.wq_b.weight", {nI * cI, D.d_c}, AttnParam::idx_wq_b, false});
  s.push_back({"attn.indexer.weights_proj.weight", {nI, D.d}, AttnParam::idx_weights_proj, false});
  s.push_back({"attn.indexer.compressor.wkv.weight", {2 * cI, D.d}, AttnParam::idx_cmp_wkv, false});
  s.push_back({"attn.indexer.compressor.wgate.weight", {2 * cI, D.d}, AttnParam::idx_cmp_wgate, false});
  s.push_back({"attn.indexer.compressor.ape", {D.ratio, 2 * cI}, AttnParam::idx_cmp_ape, false});
  s.push_back({"attn.indexer.compressor.norm.weight", {cI}, AttnParam::idx_cmp_norm, false});
  return s;
}

template <typename T>
T*& param_slot(AttentionParamsT<T>& p, AttnParam slot) {
  switch (slot) {
    case AttnParam::wq_a:
      return p.wq_a;
    case AttnParam::q_norm:
      return p.q_norm;
    case AttnParam::wq_b:
      return p.wq_b;
    case AttnParam::wkv:
      return p.wkv;
    case AttnParam::kv_norm:
      return p.kv_norm;
    case AttnParam::wo_a:
      return p.wo_a;
    case AttnParam::wo_b:
      return p.wo_b;
    case AttnParam::attn_sink:
      return p.attn_sink;
    case AttnParam::cmp_wkv:
      return p.compressor.wkv;
    case AttnParam::cmp_wgate:
      return p.compressor.wgate;
    case AttnParam::cmp_ape:
      return p.compressor.ape;
    case AttnParam::cmp_norm:
      return p.compressor.norm;
    case AttnParam::idx_wq_b:
      return p.indexer.wq_b;
    case AttnParam::idx_weights_proj:
      return p.indexer.weights_proj;
    case AttnParam::idx_cmp_wkv:
      return p.indexer.compressor.wkv;
    case AttnParam::idx_cmp_wgate:
      return p.indexer.compressor.wgate;
    case AttnParam::idx_cmp_ape:
      return p.indexer.compressor.ape;
    case AttnParam::idx_cmp_norm:
      return p.indexer.compressor.norm;
  }
  fail("param_slot: unknown attention parameter slot {}", int(slot));
}

template <typename T>
int64_t bind_attention_params(AttentionParamsT<T>& p, const std::vector<AttentionParamSpec>& specs, T* base) {
  int64_t off = 0;
  for (const auto& s : specs) {
    param_slot(p, s.slot) = base + off;
    off += numel(s.shape);
  }
  return off;
}

// ------------------------------------------------------------------------------------------------
// Small helpers
// ------------------------------------------------------------------------------------------------
namespace {

// Below this many scalar operations a loop runs on one thread: an OpenMP region costs more than the work.
constexpr int64_t kParallelWork = int64_t(1) << 17;

// y = w * x / rms(x) row-wise (w may be null: unweighted). x, y [rows, n]; rstd [rows].
template <typename T>
void rmsnorm_fwd(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t n, double eps) {
#pragma omp parallel for schedule(static) if (rows * n > kParallelWork)
  for (int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * n;
    T ss = 0;
    for (int64_t k = 0; k < n; ++k) ss += xi[k] * xi[k];
    const T r = T(1) / std::sqrt(ss / T(n) + T(eps));
    rstd[i] = r;
    for (int64_t k = 0; k < n; ++k) y[i * n + k] = (w ? w[k] : T(1)) * (xi[k] * r);
  }
}

// dx = d(rmsnorm)/dx^T dy (overwrite); dw += sum_rows dy * xhat (when dw non-null).
template <typename T>
void rmsnorm_bwd(const T* x, const T* w, const T* rstd, const T* dy, T* dx, T* dw, int64_t rows, int64_t n) {
#pragma omp parallel for schedule(static) if (rows * n > kParallelWork)
  for (int64_t i = 0; i < rows; ++i) {
    const T* xi = x + i * n;
    const T* dyi = dy + i * n;
    const T r = rstd[i];
    T dot = 0;
    for (int64_t k = 0; k < n; ++k) dot += dyi[k] * (w ? w[k] : T(1)) * xi[k] * r;
    dot /= T(n);
    for (int64_t k = 0; k < n; ++k) dx[i * n + k] = r * (dyi[k] * (w ? w[k] : T(1)) - xi[k] * r * dot);
  }
  if (dw)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < n; ++k) dw[k] += dy[i * n + k] * x[i * n + k] * rstd[i];
}

// Rotates the last rope_dim dims of each of the `heads` c-vectors of every token by sign * angle(pos).
template <typename T>
void rope_tokens(T* x, int64_t N, int64_t heads, int64_t c, int64_t rope_dim, const SeqLayout& layout,
                 const RopeTable<T>& rope, int sign) {
#pragma omp parallel for schedule(static) if (N * heads * rope_dim > kParallelWork)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t pos = layout.pos[size_t(i)];
    for (int64_t h = 0; h < heads; ++h)
      rope_rotate(x + (i * heads + h) * c + c - rope_dim, rope.cos_at(pos), rope.sin_at(pos), rope_dim / 2,
                  sign);
  }
}

}  // namespace

template <typename T>
size_t AttentionSaved<T>::bytes() const {
  const size_t scalars = qa.size() + qa_rstd.size() + cq.size() + q.size() + q_rstd.size() + kvp.size() +
                         kv_rstd.size() + kv.size() + o.size() + lse.size() + r.size() + cmp.size() +
                         kl_dscore.size() + rope.cos.size() + rope.sin.size();
  return scalars * sizeof(T) + (win_begin.size() + topk.size() + sel.size()) * sizeof(int64_t) +
         cmp_saved.bytes() + idx.bytes();
}

// ------------------------------------------------------------------------------------------------
// Layer
// ------------------------------------------------------------------------------------------------

template <typename T>
AttentionLayerT<T>::AttentionLayerT(const ModelConfig& cfg, int64_t layer)
    : dims_(AttentionDims::from_config(cfg, layer)) {}

template <typename T>
void AttentionLayerT<T>::forward(const AttentionParamsT<T>& p, const T* a, T* out, const SeqLayout& layout,
                                 AttentionSaved<T>& s, const AttentionOptions& opts) const {
  const AttentionDims& D = dims_;
  layout.validate();
  const int64_t N = layout.n_tokens(), H = D.n_heads, c = D.head_dim, r = D.rope_dim;
  const int64_t hg = H / D.o_groups, gd = D.o_groups * D.o_rank;
  s.a = a;
  s.rope = make_rope_table<T>(D.inv_freq, layout.max_pos() + 1);

  // Query path (§2.4.1).
  s.qa.resize(size_t(N * D.d_c));
  s.qa_rstd.resize(static_cast<size_t>(N));
  s.cq.resize(size_t(N * D.d_c));
  cpu::linear_fwd_t<T>(s.qa.data(), a, p.wq_a, N, D.d, D.d_c);
  rmsnorm_fwd<T>(s.qa.data(), p.q_norm, s.cq.data(), s.qa_rstd.data(), N, D.d_c, D.eps);
  s.q.resize(size_t(N * H * c));
  s.q_rstd.resize(size_t(N * H));
  cpu::linear_fwd_t<T>(s.q.data(), s.cq.data(), p.wq_b, N, D.d_c, H * c);
  rmsnorm_fwd<T>(s.q.data(), nullptr, s.q.data(), s.q_rstd.data(), N * H, c, D.eps);
  rope_tokens<T>(s.q.data(), N, H, c, r, layout, s.rope, +1);

  // Shared K=V path (§2.4.2).
  s.kvp.resize(size_t(N * c));
  s.kv_rstd.resize(static_cast<size_t>(N));
  s.kv.resize(size_t(N * c));
  cpu::linear_fwd_t<T>(s.kvp.data(), a, p.wkv, N, D.d, c);
  rmsnorm_fwd<T>(s.kvp.data(), p.kv_norm, s.kv.data(), s.kv_rstd.data(), N, c, D.eps);
  rope_tokens<T>(s.kv.data(), N, 1, c, r, layout, s.rope, +1);

  // Window: the last `window` tokens including the query, never before its document's start.
  s.win_begin.resize(static_cast<size_t>(N));
  for (int64_t b = 0; b < layout.B; ++b)
    for (int64_t t = 0; t < layout.T; ++t) {
      const int64_t i = b * layout.T + t;
      s.win_begin[size_t(i)] = b * layout.T + std::max(layout.doc_start[size_t(i)], t - D.window + 1);
    }

  cpu::SparseKeySets keys;
  keys.win_begin = s.win_begin.data();
  s.topk.clear();
  s.sel.clear();
  s.kl_dscore.clear();
  s.indexer_kl_loss = 0.0;
  if (D.type != AttnType::Sliding) {
    s.plan = make_compress_plan(layout, D.ratio);
    const int64_t E = s.plan.n_entries;
    s.cmp.resize(size_t(E * c));
    CompressorDims cd{D.d, c, r, D.type == AttnType::CSA, D.eps};
    compressor_forward(p.compressor, cd, s.plan, layout, s.rope, a, s.cmp.data(), s.cmp_saved);
    if (D.type == AttnType::HCA) {
      keys.cmp_begin = s.plan.vis_begin.data();
      keys.cmp_end = s.plan.vis_end.data();
    } else {
      const int64_t k = D.index_topk;
      s.sel.assign(size_t(N * k), -1);
      const bool run_indexer = !opts.forced_topk || opts.indexer_kl;
      IndexerDims id{D.d, D.d_c, D.index_heads, D.index_head_dim, r, k, D.eps};
      if (run_indexer)
        indexer_forward(p.indexer, id, s.plan, layout, s.rope, a, s.cq.data(), s.sel.data(), s.idx);
      if (opts.forced_topk) {
        std::vector<int64_t> sorted(static_cast<size_t>(k));
        for (int64_t i = 0; i < N; ++i) {
          const int64_t b = i / layout.T, row0 = s.plan.row_entry_begin[size_t(b)];
          for (int64_t j = 0; j < k; ++j) {
            const int64_t e = opts.forced_topk[i * k + j];
            const int64_t g = e < 0 ? -1 : row0 + e;
            TREX_CHECK(
                e >= -1 && (e < 0 || (g >= s.plan.vis_begin[size_t(i)] && g < s.plan.vis_end[size_t(i)])),
                "forced_topk: row {} token {} slot {} selects entry {}, which that query cannot see", b,
                i % layout.T, j, e);
            s.sel[size_t(i * k + j)] = g;
            sorted[size_t(j)] = g;
          }
          std::sort(sorted.begin(), sorted.end());
          for (int64_t j = 1; j < k; ++j)
            TREX_CHECK(sorted[size_t(j)] < 0 || sorted[size_t(j)] != sorted[size_t(j - 1)],
                       "forced_topk: row {} token {} selects entry {} twice", b, i % layout.T,
                       sorted[size_t(j)] - row0);
        }
        if (opts.indexer_kl) indexer_score_selected(id, s.idx, N, s.sel.data(), s.idx.score);
      }
      s.topk.resize(s.sel.size());
      for (int64_t i = 0; i < N; ++i) {
        const int64_t row0 = s.plan.row_entry_begin[size_t(i / layout.T)];
        for (int64_t j = 0; j < k; ++j) {
          const int64_t g = s.sel[size_t(i * k + j)];
          s.topk[size_t(i * k + j)] = g < 0 ? -1 : g - row0;
        }
      }
      keys.cmp_sel = s.sel.data();
      keys.k_sel = k;
    }
  }

  // Core attention with sink (§2.4.3).
  s.o.resize(size_t(N * H * c));
  s.lse.resize(size_t(N * H));
  cpu::sparse_attention_fwd<T>(s.q.data(), s.kv.data(), s.cmp.empty() ? nullptr : s.cmp.data(), p.attn_sink,
                               N, H, c, keys, s.o.data(), s.lse.data());

  // Inverse RoPE, grouped output projection (§2.4.5).
  std::vector<T> orot(s.o);
  rope_tokens<T>(orot.data(), N, H, c, r, layout, s.rope, -1);
  s.r.resize(size_t(N * gd));
  for (int64_t gi = 0; gi < D.o_groups; ++gi)
    cpu::gemm_ld<T>(s.r.data() + gi * D.o_rank, gd, orot.data() + gi * hg * c, H * c,
                    p.wo_a + gi * D.o_rank * hg * c, hg * c, N, D.o_rank, hg * c, false, true, T(1), T(0));
  cpu::linear_fwd_t<T>(out, s.r.data(), p.wo_b, N, gd, D.d);

  // Indexer KL target and gradient w.r.t. the scores of the selected slots.
  if (D.type == AttnType::CSA && opts.indexer_kl) {
    const int64_t k = D.index_topk;
    s.kl_dscore.assign(size_t(N * k), T(0));
    std::vector<T> ph(static_cast<size_t>(k)), pt(static_cast<size_t>(k));
    double loss = 0.0;
    for (int64_t i = 0; i < N; ++i) {
      std::fill(pt.begin(), pt.end(), T(0));
      for (int64_t h = 0; h < H; ++h) {
        cpu::sparse_attention_selected_probs<T>(s.q.data(), s.cmp.data(), H, c, keys, s.lse.data(), i, h,
                                                ph.data());
        for (int64_t j = 0; j < k; ++j) pt[size_t(j)] += ph[size_t(j)];
      }
      T z = 0, mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < k; ++j)
        if (s.sel[size_t(i * k + j)] >= 0) {
          z += pt[size_t(j)];
          mx = std::max(mx, s.idx.score[size_t(i * k + j)]);
        }
      if (!(z > 0)) continue;
      T zs = 0;
      for (int64_t j = 0; j < k; ++j)
        if (s.sel[size_t(i * k + j)] >= 0) zs += std::exp(s.idx.score[size_t(i * k + j)] - mx);
      for (int64_t j = 0; j < k; ++j) {
        if (s.sel[size_t(i * k + j)] < 0) continue;
        const T target = pt[size_t(j)] / z;
        const T logq = s.idx.score[size_t(i * k + j)] - mx - std::log(zs);
        if (target > 0) loss += double(target * (std::log(target) - logq));
        s.kl_dscore[size_t(i * k + j)] = T(opts.indexer_kl_weight) * (std::exp(logq) - target);
      }
    }
    s.indexer_kl_loss = opts.indexer_kl_weight * loss;
  }
}

template <typename T>
void AttentionLayerT<T>::backward(const AttentionParamsT<T>& p, const AttentionParamsT<T>& g,
                                  const SeqLayout& layout, const AttentionSaved<T>& s, const T* dout,
                                  T* da) const {
  const AttentionDims& D = dims_;
  const int64_t N = layout.n_tokens(), H = D.n_heads, c = D.head_dim, r = D.rope_dim;
  const int64_t hg = H / D.o_groups, gd = D.o_groups * D.o_rank;
  TREX_CHECK(int64_t(s.o.size()) == N * H * c,
             "attention backward: saved activations are for {} tokens, not {}", s.o.size() / size_t(H * c),
             N);
  const T* a = s.a;

  // Output projections.
  std::vector<T> dr(size_t(N * gd), T(0));
  cpu::linear_bwd_t<T>(dr.data(), g.wo_b, dout, s.r.data(), p.wo_b, N, gd, D.d);
  std::vector<T> orot(s.o);
  rope_tokens<T>(orot.data(), N, H, c, r, layout, s.rope, -1);
  std::vector<T> dO(size_t(N * H * c));
  for (int64_t gi = 0; gi < D.o_groups; ++gi) {
    cpu::gemm_ld<T>(dO.data() + gi * hg * c, H * c, dr.data() + gi * D.o_rank, gd,
                    p.wo_a + gi * D.o_rank * hg * c, hg * c, N, hg * c, D.o_rank, false, false, T(1), T(0));
    if (g.wo_a)
      cpu::gemm_ld<T>(g.wo_a + gi * D.o_rank * hg * c, hg * c, dr.data() + gi * D.o_rank, gd,
                      orot.data() + gi * hg * c, H * c, D.o_rank, hg * c, N, true, false, T(1), T(1));
  }
  orot.clear();
  orot.shrink_to_fit();
  // The inverse RoPE's transpose is the forward rotation.
  rope_tokens<T>(dO.data(), N, H, c, r, layout, s.rope, +1);

  // Core attention.
  cpu::SparseKeySets keys;
  keys.win_begin = s.win_begin.data();
  if (D.type == AttnType::HCA) {
    keys.cmp_begin = s.plan.vis_begin.data();
    keys.cmp_end = s.plan.vis_end.data();
  } else if (D.type == AttnType::CSA) {
    keys.cmp_sel = s.sel.data();
    keys.k_sel = D.index_topk;
  }
  const int64_t E = D.type == AttnType::Sliding ? 0 : s.plan.n_entries;
  std::vector<T> dq(size_t(N * H * c)), dkv(size_t(N * c), T(0)), dcmp(size_t(E * c), T(0)),
      dsink(size_t(H), T(0));
  cpu::sparse_attention_bwd<T>(s.q.data(), s.kv.data(), E ? s.cmp.data() : nullptr, p.attn_sink, N, E, H, c,
                               keys, s.o.data(), s.lse.data(), dO.data(), dq.data(), dkv.data(),
                               E ? dcmp.data() : nullptr, dsink.data());
  if (g.attn_sink)
    for (int64_t h = 0; h < H; ++h) g.attn_sink[h] += dsink[size_t(h)];
  dO.clear();
  dO.shrink_to_fit();

  // Query path: RoPE^T, per-head norm, wq_b, q_norm, wq_a.
  rope_tokens<T>(dq.data(), N, H, c, r, layout, s.rope, -1);
  std::vector<T> qhat(s.q);  // normalised queries before RoPE
  rope_tokens<T>(qhat.data(), N, H, c, r, layout, s.rope, -1);
  // For y = x * rstd with x = qhat / rstd: dx = rstd * (dy - y * mean(dy * y)).
#pragma omp parallel for schedule(static) if (N * H * c > kParallelWork)
  for (int64_t i = 0; i < N * H; ++i) {
    T* dy = dq.data() + i * c;
    const T* y = qhat.data() + i * c;
    T dot = 0;
    for (int64_t k = 0; k < c; ++k) dot += dy[k] * y[k];
    dot /= T(c);
    const T rs = s.q_rstd[size_t(i)];
    for (int64_t k = 0; k < c; ++k) dy[k] = rs * (dy[k] - y[k] * dot);
  }
  qhat.clear();
  qhat.shrink_to_fit();
  std::vector<T> dcq(size_t(N * D.d_c), T(0));
  cpu::linear_bwd_t<T>(dcq.data(), g.wq_b, dq.data(), s.cq.data(), p.wq_b, N, D.d_c, H * c);
  dq.clear();
  dq.shrink_to_fit();
  std::vector<T> dqa(size_t(N * D.d_c));
  rmsnorm_bwd<T>(s.qa.data(), p.q_norm, s.qa_rstd.data(), dcq.data(), dqa.data(), g.q_norm, N, D.d_c);
  cpu::linear_bwd_t<T>(da, g.wq_a, dqa.data(), a, p.wq_a, N, D.d, D.d_c);

  // K=V path: RoPE^T, kv_norm, wkv.
  rope_tokens<T>(dkv.data(), N, 1, c, r, layout, s.rope, -1);
  std::vector<T> dkvp(size_t(N * c));
  rmsnorm_bwd<T>(s.kvp.data(), p.kv_norm, s.kv_rstd.data(), dkv.data(), dkvp.data(), g.kv_norm, N, c);
  cpu::linear_bwd_t<T>(da, g.wkv, dkvp.data(), a, p.wkv, N, D.d, c);

  // Compressor (main) and, when trained, the indexer.
  if (E > 0) {
    CompressorDims cd{D.d, c, r, D.type == AttnType::CSA, D.eps};
    compressor_backward(p.compressor, g.compressor, cd, s.plan, layout, s.rope, a, s.cmp_saved, dcmp.data(),
                        da);
  }
  if (D.type == AttnType::CSA && !s.kl_dscore.empty()) {
    IndexerDims id{D.d, D.d_c, D.index_heads, D.index_head_dim, r, D.index_topk, D.eps};
    indexer_backward(p.indexer, g.indexer, id, s.plan, layout, s.rope, a, s.cq.data(), s.idx, s.sel.data(),
                     s.kl_dscore.data());
  }
}

template struct AttentionSaved<float>;
template struct AttentionSaved<double>;
template class AttentionLayerT<float>;
template class AttentionLayerT<double>;
template float*& param_slot<float>(AttentionParamsT<float>&, AttnParam);
template double*& param_slot<double>(AttentionParamsT<double>&, AttnParam);
template int64_t bind_attention_params<float>(AttentionParamsT<float>&,
                                              const std::vector<AttentionParamSpec>&, float*);
template int64_t bind_attention_params<double>(AttentionParamsT<double>&,
                                               const std::vector<AttentionParamSpec>&, double*);

}  // namespace trex::dsv4
