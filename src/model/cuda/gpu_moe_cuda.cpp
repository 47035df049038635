// MoE FFN of the GPU model (design §2.9), the dataflow of trex::dsv4::moe_fwd / moe_bwd: fp32 router logits,
// sqrt(softplus) scores, hash or bias-corrected top-k routing, expert-grouped permutation, clamped SwiGLU experts
// with fused w1|w3 weights, one shared expert, weighted combine. Routing and the permutation stay on the device.
// The routed experts run either as grouped GEMMs (Ctx::grouped_experts, the default: one launch per product for
// all experts, sized from the device-side offsets, so the host never waits for the routing; on sm_90 a wgmma + TMA
// kernel at cuBLASLt's rate, kernels/cuda/grouped_gemm_sm90.cuh) or as one cuBLASLt GEMM per non-empty expert
// after one host read of the offsets per layer (the backward reuses it), kept for comparison. The router's range status is copied to pinned host memory asynchronously and
// checked once it has certainly arrived (backward, or this block's next forward).
//
// Expert parallel (Ctx::ep, P ranks > 1, a device-memory communicator: NCCL or the thread group): rank r computes experts [r E/P, (r+1) E/P) for the
// tokens of every rank. The expert-grouped rows are already contiguous per owner, so they go out as they are
// (all_to_all_v); the per-expert counts are exchanged first and read on the host to size the transfer (the one
// host wait of this path: the counts come down to pinned memory on a stream of their own while the compute stream
// runs the shared expert's first half, so the device does not drain). Received rows arrive ordered (source rank,
// local expert) and are regrouped to (local expert, source rank) for the grouped GEMMs, then sent back the same
// way. The shared expert's second half runs while the rows are in flight (the communicator works on its own
// stream). A rank holds the weights of its own experts only (MoeW points at its first local expert, gpu_impl.h
// region X); their gradients are complete on it (summed over every rank's tokens), so no reduction over the group
// is needed for them.
#include <algorithm>

#include "comm/nccl_communicator.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/router.h"
#include "kernels/cuda/tensor_ops.h"
#include "model/cuda/gpu_internal.h"
#include "model/dsv4/expert_exchange.h"

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

// Throws if the router status of this block's last forward flagged an out-of-range token id or table entry. The
// event was recorded after the status copy; by the time this runs (backward, or the next forward, both after the
// forward's loss read-back) it has completed, so waiting on it costs nothing.
void check_router_status(const GpuBlock& b) {
  const MoeActs& m = b.mo;
  if (!m.status_host || !m.status_ready) return;
  TREX_CUDA(cudaEventSynchronize(m.status_ready.get()));
  TREX_CHECK(*m.status_host == 0, "MoE (CUDA) {}: a token id or a tid2eid / injected entry is out of range",
             b.prefix);
}

// Queues the copy of the device status into the block's pinned host flag (allocated on first use).
void post_router_status(MoeActs& m, const int32_t* status) {
  if (!m.status_host) {
    int32_t* p = nullptr;
    TREX_CUDA(cudaMallocHost(&p, sizeof(int32_t)));
    m.status_host = std::shared_ptr<int32_t>(p, [](int32_t* q) { cudaFreeHost(q); });
    cudaEvent_t ev = nullptr;
    TREX_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    m.status_ready = std::shared_ptr<CUevent_st>(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
  }
  TREX_CUDA(cudaMemcpyAsync(m.status_host.get(), status, sizeof(int32_t), cudaMemcpyDeviceToHost));
  TREX_CUDA(cudaEventRecord(m.status_ready.get()));
}

// Rows of one expert-parallel exchange, from this rank's point of view.
struct EpRows {
  std::vector<size_t> send_rows, send_row0, recv_rows, recv_row0;  // per peer rank
  // int32 [n_recv] on the device: source-major received row i sits at expert-major row recv_to_grouped[i]
  // (dsv4::plan_exchange_rows; one launch per regroup, kernels/cuda/router.h rows_scatter / rows_gather).
  DevMem recv_to_grouped;
  int64_t n_rows = 0;
};

}  // namespace

// The exchange plan of the last forward plus the expert-major activations the backward needs (kept per block).
struct MoeEpState {
  int64_t n_local = 0, e0 = 0;  // local experts [e0, e0 + n_local)
  int64_t n_recv = 0;           // rows this rank computes
  EpRows rows;
  DevMem local_offsets;  // int32 [n_local + 1], expert-major offsets of the received rows
  std::vector<int32_t> h_local_offsets;  // the same on the host
  bf16* xl = nullptr;    // [n_recv, d] expert-major inputs (in the block's keep pool)
};

namespace {

// The expert FFN over rows grouped by expert (all experts, or this rank's slice under EP).
struct ExpertRows {
  int64_t rows = 0, n_experts = 0;
  const int32_t* offsets = nullptr;    // device [n_experts + 1]
  const int32_t* h_offsets = nullptr;  // host copy: one GEMM per expert; null: grouped GEMMs
  const bf16 *w13 = nullptr, *w2 = nullptr;
  float *g_w13 = nullptr, *g_w2 = nullptr;
};

ExpertRows expert_rows(const Ctx& c, const GpuBlock& b) {
  const MoeW& w = b.mw;
  ExpertRows x;
  if (const MoeEpState* st = b.mo.ep.get()) {
    x.rows = st->n_recv, x.n_experts = st->n_local, x.offsets = st->local_offsets.as<int32_t>();
    x.w13 = w.w13, x.w2 = w.w2, x.g_w13 = w.g_w13, x.g_w2 = w.g_w2;  // the rank holds only its own experts
    if (!c.grouped_experts) x.h_offsets = st->h_local_offsets.data();
  } else {
    x.rows = c.lay->N * c.cfg->topk, x.n_experts = c.cfg->n_routed_experts, x.offsets = b.mo.offsets;
    x.w13 = w.w13, x.w2 = w.w2, x.g_w13 = w.g_w13, x.g_w2 = w.g_w2;
    if (!c.grouped_experts) {
      TREX_CHECK(int64_t(b.mo.h_offsets.size()) == x.n_experts + 1, "MoE (CUDA) {}: no host offsets of the forward",
                 b.prefix);
      x.h_offsets = b.mo.h_offsets.data();
    }
  }
  return x;
}

// y[r, out] = x[r, in] W_e[out, in]^T over the expert rows.
void experts_fwd(const Ctx& c, const ExpertRows& x, bf16* y, const bf16* in_rows, const bf16* W, int64_t in,
                 int64_t out, int32_t* gscratch) {
  if (!x.h_offsets) {
    cuda::grouped_linear_fwd(y, in_rows, W, x.offsets, x.n_experts, x.rows, in, out, gscratch);
    return;
  }
  for (int64_t e = 0; e < x.n_experts; ++e) {
    const int64_t r0 = x.h_offsets[e], n = x.h_offsets[e + 1] - r0;
    if (n > 0) c.lin.fwd(y + r0 * out, in_rows + r0 * in, W + e * out * in, n, in, out);
  }
}
// dx[r, in] = dy[r, out] W_e[out, in].
void experts_dx(const Ctx& c, const ExpertRows& x, bf16* dx, const bf16* dy, const bf16* W, int64_t in, int64_t out,
                int32_t* gscratch) {
  if (!x.h_offsets) {
    cuda::grouped_linear_dx(dx, dy, W, x.offsets, x.n_experts, x.rows, in, out, gscratch);
    return;
  }
  for (int64_t e = 0; e < x.n_experts; ++e) {
    const int64_t r0 = x.h_offsets[e], n = x.h_offsets[e + 1] - r0;
    if (n > 0) c.lin.dx(dx + r0 * in, dy + r0 * out, W + e * out * in, n, in, out);
  }
}
// dW_e[out, in] += dy_e^T x_e (fp32).
void experts_dw(const Ctx& c, const ExpertRows& x, float* dW, const bf16* dy, const bf16* in_rows, int64_t in,
                int64_t out) {
  if (!x.h_offsets) {
    cuda::grouped_linear_dw(dW, dy, in_rows, x.offsets, x.n_experts, x.rows, in, out);
    return;
  }
  for (int64_t e = 0; e < x.n_experts; ++e) {
    const int64_t r0 = x.h_offsets[e], n = x.h_offsets[e + 1] - r0;
    if (n > 0) c.lin.dw(dW + e * out * in, dy + r0 * out, in_rows + r0 * in, n, in, out);
  }
}

bool expert_parallel(const Ctx& c) { return c.ep && c.ep->size() > 1; }

}  // namespace

// The count exchange runs ahead of the row plan: its results come back to pinned host memory on the staging's own
// stream while the compute stream gathers the rows and runs the shared expert, so the host's one wait per layer sits
// under that work instead of draining the device (a synchronous copy would wait for everything queued before it).
struct EpStaging {
  int64_t E = 0;
  DevMem d_send, d_recv;  // int32 [E]: this rank's per-expert counts; the counts it receives [source][local expert]
  int32_t* host = nullptr;  // pinned: offsets [E + 1] and received counts [E] coming down, then the row plan going up
  size_t host_elems = 0;
  cudaStream_t copy = nullptr;
  cudaEvent_t issued = nullptr, arrived = nullptr, uploaded = nullptr;

  explicit EpStaging(int64_t n_experts) : E(n_experts), d_send(size_t(n_experts) * 4), d_recv(size_t(n_experts) * 4) {
    TREX_CUDA(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&issued, &arrived, &uploaded}) TREX_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    TREX_CUDA(cudaEventRecord(uploaded, nullptr));
  }
  ~EpStaging() {
    cudaEventSynchronize(uploaded);
    if (host) cudaFreeHost(host);
    for (cudaEvent_t e : {issued, arrived, uploaded}) cudaEventDestroy(e);
    cudaStreamDestroy(copy);
  }
  EpStaging(const EpStaging&) = delete;
  EpStaging& operator=(const EpStaging&) = delete;

  // Room for `elems` int32 in the pinned buffer, once the previous upload out of it has left.
  int32_t* reserve(size_t elems) {
    TREX_CUDA(cudaEventSynchronize(uploaded));
    if (elems > host_elems) {
      if (host) TREX_CUDA(cudaFreeHost(host));
      host = nullptr;
      const size_t n = std::max(elems, 2 * host_elems);
      TREX_CUDA(cudaMallocHost(&host, n * sizeof(int32_t)));
      host_elems = n;
    }
    return host;
  }
};

namespace {

// Starts the count exchange of this forward: the per-expert counts (device) to every owner, the offsets and the
// received counts back to the host on the staging stream. Nothing here waits on the device.
EpStaging& ep_counts_start(const Ctx& c, GpuBlock& b, const int32_t* offsets) {
  comm::Communicator& ep = *c.ep;
  const int P = ep.size();
  const int64_t E = c.cfg->n_routed_experts;
  TREX_CHECK(device_memory_comm(ep),
             "MoE (CUDA) {}: expert parallelism needs a device-memory communicator (nccl or threads), got '{}'",
             b.prefix, ep.backend());
  TREX_CHECK(E % P == 0, "MoE (CUDA) {}: {} experts do not divide over {} expert-parallel ranks", b.prefix, E, P);
  if (!b.mo.ep_staging) b.mo.ep_staging = std::make_shared<EpStaging>(E);
  EpStaging& st = *b.mo.ep_staging;
  const int64_t El = E / P;
  int32_t* h = st.reserve(size_t(2 * E + 1));
  cuda::moe_expert_counts(offsets, E, st.d_send.as<int32_t>());
  std::vector<size_t> bytes(static_cast<size_t>(P), size_t(El) * 4), boff(static_cast<size_t>(P));
  for (int p = 0; p < P; ++p) boff[size_t(p)] = size_t(p) * size_t(El) * 4;
  comm::WorkPtr counts = ep.all_to_all_v(st.d_send.as<int32_t>(), bytes, boff, st.d_recv.as<int32_t>(), bytes, boff);
  // The staging stream follows both the compute stream (the offsets; a communicator that copies on it) and the
  // collective's own completion.
  TREX_CUDA(cudaEventRecord(st.issued, nullptr));
  TREX_CUDA(cudaStreamWaitEvent(st.copy, st.issued, 0));
  comm::stream_wait(*counts, st.copy);
  TREX_CUDA(cudaMemcpyAsync(h, offsets, size_t(E + 1) * 4, cudaMemcpyDeviceToHost, st.copy));
  TREX_CUDA(cudaMemcpyAsync(h + E + 1, st.d_recv.as<int32_t>(), size_t(E) * 4, cudaMemcpyDeviceToHost, st.copy));
  TREX_CUDA(cudaEventRecord(st.arrived, st.copy));
  return st;
}

// Waits for the counts on the host and derives the row plan; its device side goes up from the pinned buffer on
// the compute stream, ahead of the dispatch that reads it.
std::shared_ptr<MoeEpState> ep_plan_finish(const Ctx& c, EpStaging& sg) {
  comm::Communicator& ep = *c.ep;
  const int P = ep.size(), r = ep.rank();
  const int64_t E = c.cfg->n_routed_experts, El = E / P;
  TREX_CUDA(cudaEventSynchronize(sg.arrived));
  auto st = std::make_shared<MoeEpState>();
  st->n_local = El, st->e0 = r * El;
  // The row plan shared with the CPU's exchange (model/dsv4/expert_exchange.h).
  const std::vector<int64_t> expert_offset(sg.host, sg.host + E + 1), recv_counts(sg.host + E + 1, sg.host + 2 * E + 1);
  dsv4::ExchangeRows x = dsv4::plan_exchange_rows(expert_offset, recv_counts, P, int(El));
  EpRows& R = st->rows;
  R.send_rows = std::move(x.send_rows), R.send_row0 = std::move(x.send_offsets);
  R.recv_rows = std::move(x.recv_rows), R.recv_row0 = std::move(x.recv_offsets);
  R.n_rows = st->n_recv = int64_t(x.recv_to_grouped.size());
  std::vector<int32_t> loc(static_cast<size_t>(El + 1), 0);
  for (int64_t j = 0; j < El; ++j) loc[size_t(j + 1)] = loc[size_t(j)] + int32_t(x.expert_counts[size_t(j)]);
  int32_t* up = sg.reserve(size_t(R.n_rows + El + 1));
  for (int64_t i = 0; i < R.n_rows; ++i) up[i] = int32_t(x.recv_to_grouped[size_t(i)]);
  std::copy(loc.begin(), loc.end(), up + R.n_rows);
  if (R.n_rows > 0) {
    R.recv_to_grouped = DevMem(size_t(R.n_rows) * 4);
    TREX_CUDA(cudaMemcpyAsync(R.recv_to_grouped.as<int32_t>(), up, size_t(R.n_rows) * 4, cudaMemcpyHostToDevice));
  }
  st->local_offsets = DevMem(size_t(El + 1) * 4);
  TREX_CUDA(cudaMemcpyAsync(st->local_offsets.as<int32_t>(), up + R.n_rows, loc.size() * 4, cudaMemcpyHostToDevice));
  TREX_CUDA(cudaEventRecord(sg.uploaded, nullptr));
  st->h_local_offsets = std::move(loc);
  return st;
}

// Source-major received rows <-> expert-major rows, [*, d] bf16.
void ep_regroup(bf16* dst, const bf16* src, const EpRows& R, int64_t d, bool to_expert_major) {
  const int32_t* idx = R.recv_to_grouped.as<int32_t>();
  if (to_expert_major)
    cuda::rows_scatter(dst, src, idx, R.n_rows, d);
  else
    cuda::rows_gather(dst, src, idx, R.n_rows, d);
}

// Sends [*, d] bf16 rows: dispatch = expert-grouped rows of this rank's tokens -> owners (source-major on
// arrival); otherwise the way back.
comm::WorkPtr ep_exchange(comm::Communicator& ep, const bf16* send, bf16* recv, const EpRows& R, int64_t d,
                          bool dispatch) {
  const size_t row = size_t(d) * sizeof(bf16);
  auto scale = [&](const std::vector<size_t>& v) {
    std::vector<size_t> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = v[i] * row;
    return o;
  };
  const auto sb = scale(R.send_rows), so = scale(R.send_row0), rb = scale(R.recv_rows), ro = scale(R.recv_row0);
  return dispatch ? ep.all_to_all_v(send, sb, so, recv, rb, ro) : ep.all_to_all_v(send, rb, ro, recv, sb, so);
}

}  // namespace

void moe_fwd(const Ctx& c, GpuBlock& b, const int32_t* injected_sel, bool replay) {
  const int64_t N = c.lay->N, d = c.cfg->hidden, E = c.cfg->n_routed_experts, K = c.cfg->topk;
  const int64_t fs = c.cfg->moe_inter * c.cfg->n_shared_experts / c.tp_size;  // this TP rank's shared hidden width
  const int64_t f = c.expert_width;  // of each routed expert, this rank's share
  const float limit = float(c.cfg->swiglu_limit);
  check_router_status(b);  // the previous forward's (forward-only runs never reach moe_bwd)
  Pool& keep = b.keep;
  MoeActs& m = b.mo;
  const MoeW& w = b.mw;
  SectionParts part(c, "fwd.moe/");
  part.next("router");
  m.logits = keep.take<float>(N * E), m.scores = keep.take<float>(N * E), m.weight = keep.take<float>(N * K);
  // The selection lives in picks: a replay (full recomputation) routes to the same experts again.
  if (replay)
    TREX_CHECK(m.sel, "MoE (CUDA) {}: replay without the forward's saved selection", b.prefix);
  else
    m.sel = b.picks.take<int32_t>(N * K);
  m.order = keep.take<int32_t>(N * K), m.slot_pos = keep.take<int32_t>(N * K);
  m.offsets = keep.take<int32_t>(E + 1);
  c.lin.fwd(m.logits, b.u, w.gate, N, d, E, true);
  Pool tmp(c.scratch);
  int32_t* status = keep.zeros<int32_t>(1);  // kept: the pinned copy below reads it asynchronously
  if (replay) {
    // The saved choice as a per-token table (the injected path below): the gate weights come from the recomputed
    // scores of the same experts in the same order, so they are the forward's bit for bit.
    int32_t* table = tmp.take<int32_t>(N * K);
    TREX_CUDA(cudaMemcpyAsync(table, m.sel, size_t(N * K) * sizeof(int32_t), cudaMemcpyDeviceToDevice));
    cuda::router_fwd(router_shape(c, b, true), m.logits, nullptr, table, N, c.lay->token_iota.as<int32_t>(),
                     m.scores, m.sel, m.weight, status);
  } else if (injected_sel) {
    // The injected selection acts as a per-token "hash table": weights still come from this forward's scores.
    int32_t* table = tmp.take<int32_t>(N * K);
    TREX_CUDA(cudaMemcpyAsync(table, injected_sel, size_t(N * K) * sizeof(int32_t), cudaMemcpyHostToDevice));
    cuda::router_fwd(router_shape(c, b, true), m.logits, nullptr, table, N, c.lay->token_iota.as<int32_t>(),
                     m.scores, m.sel, m.weight, status);
  } else if (c.balanced_sel) {  // forced balanced routing (GpuModelOptions::balanced_routing), on the device
    cuda::router_fwd(router_shape(c, b, true), m.logits, nullptr, c.balanced_sel, N, c.lay->token_iota.as<int32_t>(),
                     m.scores, m.sel, m.weight, status);
  } else {
    cuda::router_fwd(router_shape(c, b, false), m.logits, w.bias, w.tid2eid, c.cfg->vocab_size,
                     c.lay->ids.as<int32_t>(), m.scores, m.sel, m.weight, status);
  }
  int32_t* scratch = tmp.take<int32_t>(cuda::moe_route_plan_scratch(N, K, E));
  cuda::moe_route_plan(m.sel, N, K, E, m.order, m.slot_pos, m.offsets, scratch);
  post_router_status(m, status);
  m.h_offsets.clear();
  if (!c.grouped_experts && !expert_parallel(c)) {  // per-expert GEMMs: the one host read of this layer
    m.h_offsets.resize(size_t(E + 1));
    TREX_CUDA(cudaMemcpy(m.h_offsets.data(), m.offsets, size_t(E + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost));
  }

  bf16* xe = tmp.take<bf16>(N * K * d);
  part.next("gather");
  cuda::moe_gather(xe, b.u, m.order, N, K, d);
  const bf16* add = nullptr;
  // The shared expert in two halves: under EP the first (w1|w3 and the SwiGLU) runs while the counts travel and the
  // host waits for them, the second (w2) while the rows travel.
  bf16* sh = nullptr;
  auto shared_up = [&] {
    if (fs == 0) return;
    part.next("shared");
    m.sgu = keep.take<bf16>(N * 2 * fs);
    c.lin.fwd(m.sgu, b.u, w.sw13, N, d, 2 * fs);
    sh = tmp.take<bf16>(N * fs);
    cuda::swiglu_fwd(sh, m.sgu, N, fs, limit);
  };
  // Expert tensor parallel: the shared expert's partial output and the routed experts' partial combine are summed
  // here in fp32, then over TP once.
  float* partial = c.expert_tp ? tmp.take<float>(N * d) : nullptr;
  auto shared_down = [&] {
    if (partial) {
      part.next("shared");
      if (fs > 0)
        c.lin.fwd(partial, sh, w.sw2, N, fs, d, true);
      else
        TREX_CUDA(cudaMemsetAsync(partial, 0, size_t(N * d) * sizeof(float), nullptr));
      return;
    }
    if (fs == 0) return;
    part.next("shared");
    m.sy = keep.take<bf16>(N * d);
    if (c.tp) {  // row-parallel w2: this rank's hidden columns' partial output, summed over TP in fp32
      float* y = tmp.take<float>(N * d);
      c.lin.fwd(y, sh, w.sw2, N, fs, d, true);
      comm::WorkPtr sum = c.tp->all_reduce(y, size_t(N * d), comm::ElemType::F32, comm::ReduceOp::Sum);
      comm::stream_wait(*sum, nullptr);
      cuda::cast_f32_to_bf16(m.sy, y, N * d);
    } else {
      c.lin.fwd(m.sy, sh, w.sw2, N, fs, d);
    }
    add = m.sy;
  };
  m.ep.reset();
  const bf16* xl = xe;  // the rows this rank's experts compute, expert-major
  bf16* xr = nullptr;   // under EP: the received rows, source-major
  if (expert_parallel(c)) {
    // The counts travel (and the host waits for them) while the shared expert runs.
    EpStaging& counts = ep_counts_start(c, b, m.offsets);
    shared_up();
    part.next("exchange");
    m.ep = ep_plan_finish(c, counts);
    MoeEpState& st = *m.ep;
    xr = tmp.take<bf16>(st.n_recv * d);
    comm::WorkPtr sent = ep_exchange(*c.ep, xe, xr, st.rows, d, true);
    shared_down();
    comm::stream_wait(*sent, nullptr);
    st.xl = keep.take<bf16>(st.n_recv * d);
    ep_regroup(st.xl, xr, st.rows, d, true);
    xl = st.xl;
  } else {
    shared_up();
    shared_down();
  }
  const ExpertRows x = expert_rows(c, b);
  int32_t* gscratch = tmp.take<int32_t>(cuda::grouped_linear_scratch(x.n_experts));
  part.next("experts");
  m.gu = keep.take<bf16>(x.rows * 2 * f);  // under EP: this rank's expert-major rows
  experts_fwd(c, x, m.gu, xl, x.w13, d, 2 * f, gscratch);
  bf16* h = tmp.take<bf16>(x.rows * f);
  cuda::swiglu_fwd(h, m.gu, x.rows, f, limit);
  m.ye = keep.take<bf16>(N * K * d);
  if (m.ep) {
    bf16* yl = tmp.take<bf16>(x.rows * d);
    experts_fwd(c, x, yl, h, x.w2, f, d, gscratch);
    ep_regroup(xr, yl, m.ep->rows, d, false);  // xr is consumed: reuse it for the outgoing outputs
    comm::WorkPtr back = ep_exchange(*c.ep, xr, m.ye, m.ep->rows, d, false);
    comm::stream_wait(*back, nullptr);
  } else {
    experts_fwd(c, x, m.ye, h, x.w2, f, d, gscratch);
  }
  part.next("combine");
  if (partial) {
    cuda::moe_combine_accumulate(partial, m.ye, m.slot_pos, m.weight, N, K, d);
    comm::WorkPtr sum = c.tp->all_reduce(partial, size_t(N * d), comm::ElemType::F32, comm::ReduceOp::Sum);
    comm::stream_wait(*sum, nullptr);
    cuda::cast_f32_to_bf16(b.y_f, partial, N * d);
  } else {
    cuda::moe_combine(b.y_f, m.ye, m.slot_pos, m.weight, add, N, K, d);
  }
}

void moe_bwd(const Ctx& c, GpuBlock& b, const bf16* dout, float* du) {
  const int64_t N = c.lay->N, d = c.cfg->hidden, E = c.cfg->n_routed_experts, K = c.cfg->topk;
  const int64_t fs = c.cfg->moe_inter * c.cfg->n_shared_experts / c.tp_size;  // this TP rank's shared hidden width
  const int64_t f = c.expert_width;  // of each routed expert, this rank's share
  const float limit = float(c.cfg->swiglu_limit);
  check_router_status(b);
  const MoeActs& m = b.mo;
  const MoeW& w = b.mw;
  Pool tmp(c.scratch);
  SectionParts part(c, "bwd.moe/");
  part.next("combine");
  bf16* dye = tmp.take<bf16>(N * K * d);
  float* dweight = tmp.take<float>(N * K);
  cuda::moe_combine_bwd(dye, dweight, dout, m.ye, m.slot_pos, m.weight, N, K, d);
  // Expert tensor parallel: ye is this rank's share of each expert's output, so dout . ye is a partial sum of the
  // gate weights' gradients; summed over TP they are the whole ones, the same bits on every rank (the router is
  // replicated). The all-reduce runs while the experts' backward does.
  comm::WorkPtr dweight_sum;
  if (c.expert_tp) dweight_sum = c.tp->all_reduce(dweight, size_t(N * K), comm::ElemType::F32, comm::ReduceOp::Sum);

  auto shared_expert = [&] {
    if (fs == 0) return;
    part.next("shared");
    bf16* sh = tmp.take<bf16>(N * fs);
    cuda::swiglu_fwd(sh, m.sgu, N, fs, limit);
    c.lin.dw(w.g_sw2, dout, sh, N, fs, d);
    bf16* dsh = sh;
    c.lin.dx(dsh, dout, w.sw2, N, fs, d);
    bf16* dsgu = tmp.take<bf16>(N * 2 * fs);
    cuda::swiglu_bwd(dsgu, dsh, m.sgu, N, fs, limit);
    c.lin.dw(w.g_sw13, dsgu, b.u, N, d, 2 * fs);
    c.lin.dx(du, dsgu, w.sw13, N, d, 2 * fs, true, 1.f);
    // Tensor parallel (column-parallel w1 | w3): du holds only this rank's share of the shared expert's input
    // gradient so far (the caller zeroes it, and the routed experts and the router add theirs after this), so
    // summing it over TP here gives every rank the same full gradient before the replicated parts add to it.
    // Under expert TP the routed experts' input gradients are partial too: the sum waits for them (below).
    if (c.tp && !c.expert_tp) {
      comm::WorkPtr sum = c.tp->all_reduce(du, size_t(N * d), comm::ElemType::F32, comm::ReduceOp::Sum);
      comm::stream_wait(*sum, nullptr);
    }
  };
  const ExpertRows x = expert_rows(c, b);
  const bf16* dyl = dye;  // output gradients of this rank's expert rows, expert-major
  const bf16* xl = nullptr;
  bf16* dyr = nullptr;
  if (m.ep) {
    TREX_CHECK(expert_parallel(c), "MoE (CUDA) {}: forward ran expert-parallel, backward without the group",
               b.prefix);
    const MoeEpState& st = *m.ep;
    dyr = tmp.take<bf16>(st.n_recv * d);
    comm::WorkPtr sent = ep_exchange(*c.ep, dye, dyr, st.rows, d, true);
    shared_expert();  // while the gradients travel
    comm::stream_wait(*sent, nullptr);
    bf16* t = tmp.take<bf16>(st.n_recv * d);
    ep_regroup(t, dyr, st.rows, d, true);
    dyl = t;
    xl = st.xl;
  } else {
    shared_expert();
  }

  int32_t* gscratch = tmp.take<int32_t>(cuda::grouped_linear_scratch(x.n_experts));
  part.next("experts");
  bf16* h = tmp.take<bf16>(x.rows * f);
  cuda::swiglu_fwd(h, m.gu, x.rows, f, limit);
  bf16* dh = tmp.take<bf16>(x.rows * f);
  experts_dx(c, x, dh, dyl, x.w2, f, d, gscratch);
  experts_dw(c, x, x.g_w2, dyl, h, f, d);
  bf16* dgu = tmp.take<bf16>(x.rows * 2 * f);
  cuda::swiglu_bwd(dgu, dh, m.gu, x.rows, f, limit);
  if (!m.ep) {
    bf16* xe = dye;  // dye is consumed: reuse it for the re-gathered expert inputs
    cuda::moe_gather(xe, b.u, m.order, N, K, d);
    xl = xe;
  }
  experts_dw(c, x, x.g_w13, dgu, xl, d, 2 * f);
  bf16* dxl = tmp.take<bf16>(x.rows * d);
  experts_dx(c, x, dxl, dgu, x.w13, d, 2 * f, gscratch);
  const bf16* dxe = dxl;
  if (m.ep) {
    ep_regroup(dyr, dxl, m.ep->rows, d, false);  // dyr is consumed: reuse it for the outgoing input gradients
    bf16* back = dye;                            // and dye (read by the dispatch above) for what comes back
    comm::WorkPtr got = ep_exchange(*c.ep, dyr, back, m.ep->rows, d, false);
    comm::stream_wait(*got, nullptr);
    dxe = back;
  }
  part.next("gather");
  cuda::moe_gather_bwd(du, dxe, m.slot_pos, N, K, d);
  if (c.expert_tp) {  // the shared and the routed experts' partial input gradients, summed over TP at once
    comm::WorkPtr sum = c.tp->all_reduce(du, size_t(N * d), comm::ElemType::F32, comm::ReduceOp::Sum);
    comm::stream_wait(*sum, nullptr);
    comm::stream_wait(*dweight_sum, nullptr);
  }

  // Router: gate weights -> scores -> logits -> gate GEMM.
  part.next("router");
  float* dlogits = tmp.take<float>(N * E);
  cuda::router_bwd(router_shape(c, b, false), m.logits, m.scores, m.sel, dweight, m.dscores, dlogits);
  bf16* dlogits_b = tmp.take<bf16>(N * E);
  cuda::cast_f32_to_bf16(dlogits_b, dlogits, N * E);
  c.lin.dw(w.g_gate, dlogits_b, b.u, N, d, E);
  c.lin.dx(du, dlogits_b, w.gate, N, d, E, true, 1.f);
}

}  // namespace trex::dsv4gpu
