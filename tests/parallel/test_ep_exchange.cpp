// Expert parallelism of the CPU MoE layer and model (EpExchange over MPI) against single-process runs.
//
// The EpMpi tests launch this binary under mpirun with TREX_EP_WORKER=1; the EpWorker tests then run on every
// rank (they skip unless that variable is set). Each rank takes its share of a global batch, runs it with its
// experts only, and the checks are: every output / input gradient row of its tokens, the gradient of every expert
// it holds, and (after the data-parallel sums) every dense gradient equal a single-process run of the whole batch.
// Comparisons never change control flow (EXPECT only), so a mismatch cannot leave a rank out of a collective.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "model/dsv4/moe.h"
#include "parallel/ep_exchange.h"
#include "parallel/mesh.h"
#include "parallel/ep_test_util.h"

using namespace trex;
using namespace trex::dsv4;
using namespace trex::ep_test;

namespace {

// ---------------------------------------------------------------------------------------------------------------
// MoE layer: random weights for every expert, tokens, an upstream gradient; routing optionally skewed so that every
// token picks experts 0 and 1.
struct MoeCase {
  MoeShape s;  // n_tok: the global batch
  int64_t vocab = 11;
  std::vector<float> gate, w1, w3, w2, sw1, sw3, sw2, bias, u, r;
  std::vector<int32_t> tid2eid, ids;
};

MoeCase make_moe_case(int64_t n_tok, int64_t E, bool hash, bool skew, uint64_t seed) {
  MoeCase c;
  MoeShape& s = c.s;
  s.n_tok = n_tok, s.d = 8, s.n_experts = E, s.topk = 2, s.inter = 4, s.shared_inter = 4;
  s.routed_scale = 1.5, s.swiglu_limit = 1.0, s.hash = hash;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.5f);
  auto fill = [&](std::vector<float>& v, int64_t n) {
    v.resize(size_t(n));
    for (auto& x : v) x = nd(rng);
  };
  const int64_t d = s.d, f = s.inter, fs = s.shared_inter;
  fill(c.gate, E * d), fill(c.w1, E * f * d), fill(c.w3, E * f * d), fill(c.w2, E * d * f);
  fill(c.sw1, fs * d), fill(c.sw3, fs * d), fill(c.sw2, d * fs), fill(c.bias, E);
  fill(c.u, n_tok * d), fill(c.r, n_tok * d);
  std::uniform_int_distribution<int> ue(0, int(E) - 1), ut(0, int(c.vocab) - 1);
  for (int64_t v = 0; v < c.vocab; ++v) {
    int a = skew ? 0 : ue(rng), b = skew ? 1 : ue(rng);
    while (b == a) b = ue(rng);
    c.tid2eid.push_back(a), c.tid2eid.push_back(b);
  }
  if (skew) c.bias[0] = c.bias[1] = 100.f;  // sqrt(softplus) scores are O(1): experts 0 and 1 always win
  for (int64_t t = 0; t < n_tok; ++t) c.ids.push_back(ut(rng));
  return c;
}

struct MoeResult {
  std::vector<float> out, du, gate, w1, w3, w2, sw1, sw3, sw2;
  std::vector<int32_t> sel;
};

// Tokens [t0, t0 + n) of the case, split into `micro` micro-batches that are all in flight at once (forwards in
// order, backwards in reverse), with the experts [e0, e0 + El) held here and the given exchange (null: local).
MoeResult run_moe(const MoeCase& c, int64_t t0, int64_t n, int64_t micro, ExpertExchange<float>* ex, int64_t e0,
                  int64_t El) {
  const int64_t d = c.s.d, f = c.s.inter, K = c.s.topk;
  MoeResult res;
  res.out.assign(size_t(n * d), 0.f), res.du.assign(size_t(n * d), 0.f), res.sel.assign(size_t(n * K), 0);
  res.gate.assign(c.gate.size(), 0.f), res.sw1.assign(c.sw1.size(), 0.f), res.sw3.assign(c.sw3.size(), 0.f);
  res.sw2.assign(c.sw2.size(), 0.f);
  res.w1.assign(size_t(El * f * d), 0.f), res.w3.assign(size_t(El * f * d), 0.f), res.w2.assign(size_t(El * d * f), 0.f);
  MoeWeights<float> w{c.gate.data(), c.w1.data() + e0 * f * d, c.w3.data() + e0 * f * d, c.w2.data() + e0 * d * f,
                      c.sw1.data(), c.sw3.data(), c.sw2.data(), c.s.hash ? nullptr : c.bias.data(),
                      c.tid2eid.data(), c.vocab};
  MoeGrads<float> g{res.gate.data(), res.w1.data(), res.w3.data(), res.w2.data(),
                    res.sw1.data(), res.sw3.data(), res.sw2.data()};
  struct Mb {
    MoeShape s;
    std::vector<float> tb;
    std::vector<int32_t> ib;
    MoeActs<float> a;
    int64_t t0 = 0;
  };
  std::vector<Mb> mbs(static_cast<size_t>(micro));
  for (int64_t m = 0; m < micro; ++m) {
    Mb& mb = mbs[size_t(m)];
    mb.t0 = n * m / micro;
    mb.s = c.s;
    mb.s.n_tok = n * (m + 1) / micro - mb.t0;
    const MoeActSizes sz = moe_act_sizes(mb.s);
    mb.tb.assign(size_t(sz.t_elems), 0.f), mb.ib.assign(size_t(sz.i32_elems), 0);
    mb.a = moe_acts_bind(mb.s, mb.tb.data(), mb.ib.data());
  }
  const ExchangeKey key0{3, 0};
  for (int64_t m = 0; m < micro; ++m) {
    Mb& mb = mbs[size_t(m)];
    const int64_t t = t0 + mb.t0;
    moe_fwd(mb.s, w, c.u.data() + t * d, c.ids.data() + t, mb.a, res.out.data() + mb.t0 * d, ex,
            ExchangeKey{key0.layer, m});
    std::copy_n(mb.a.sel, mb.s.n_tok * K, res.sel.data() + mb.t0 * K);
  }
  for (int64_t m = micro - 1; m >= 0; --m) {
    Mb& mb = mbs[size_t(m)];
    const int64_t t = t0 + mb.t0;
    moe_bwd(mb.s, w, c.u.data() + t * d, mb.a, c.r.data() + t * d, static_cast<const float*>(nullptr), res.du.data() + mb.t0 * d, g, ex,
            ExchangeKey{key0.layer, m});
  }
  return res;
}

// The whole batch in one process; then each of `ranks` ranks runs its share with EP over `ep`; the checks above.
void check_moe_ep(comm::Communicator& ep, const MoeCase& c, int64_t micro) {
  const int R = ep.size(), me = ep.rank();
  const int64_t N = c.s.n_tok, E = c.s.n_experts, d = c.s.d, f = c.s.inter, K = c.s.topk;
  ASSERT_EQ(N % R, 0);
  const MoeResult ref = run_moe(c, 0, N, 1, nullptr, 0, E);
  parallel::EpExchange ex(ep, E, d);
  const int64_t e0 = ex.expert_begin(), El = ex.expert_end() - e0, n = N / R, t0 = me * n;
  EXPECT_EQ(El, E / R);
  MoeResult got = run_moe(c, t0, n, micro, &ex, e0, El);
  EXPECT_EQ(ex.handles(), 0u) << "every handle is released by the backward";
  const std::string at = " (rank " + std::to_string(me) + ")";
  EXPECT_EQ(got.sel, std::vector<int32_t>(ref.sel.begin() + t0 * K, ref.sel.begin() + (t0 + n) * K)) << at;
  expect_close("out" + at, got.out.data(), ref.out.data() + t0 * d, n * d);
  expect_close("du" + at, got.du.data(), ref.du.data() + t0 * d, n * d);
  // Expert gradients are complete on their holder (every rank's tokens reached it).
  expect_close("w1" + at, got.w1.data(), ref.w1.data() + e0 * f * d, El * f * d);
  expect_close("w3" + at, got.w3.data(), ref.w3.data() + e0 * f * d, El * f * d);
  expect_close("w2" + at, got.w2.data(), ref.w2.data() + e0 * d * f, El * d * f);
  // Dense gradients are partial sums over this rank's tokens.
  for (auto* v : {&got.gate, &got.sw1, &got.sw3, &got.sw2}) ep.all_reduce_sum(v->data(), v->size());
  expect_close("gate" + at, got.gate.data(), ref.gate.data(), int64_t(ref.gate.size()));
  expect_close("sw1" + at, got.sw1.data(), ref.sw1.data(), int64_t(ref.sw1.size()));
  expect_close("sw3" + at, got.sw3.data(), ref.sw3.data(), int64_t(ref.sw3.size()));
  expect_close("sw2" + at, got.sw2.data(), ref.sw2.data(), int64_t(ref.sw2.size()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Single process: EpExchange over the local communicator is the local exchange; the local exchange reproduces the
// per-expert grouping of the router.

TEST(EpExchange, LocalExchangeGroupsByExpertAndRoundTrips) {
  const int64_t N = 7, K = 2, E = 4, d = 3;
  std::vector<int32_t> sel = {0, 3, 3, 1, 2, 0, 1, 3, 3, 0, 2, 1, 0, 2};
  std::vector<float> x(size_t(N * d));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  LocalExpertExchange<float> ex(E);
  const ExchangeKey key{0, 0};
  EXPECT_EQ(ex.plan(key, sel.data(), N, K, d), (std::vector<int64_t>{4, 3, 3, 4}));
  ex.dispatch(key, x.data(), false);
  const float* g = ex.dispatch_wait(key);
  // Expert 0's rows: tokens 0, 2, 4, 6 (slots 0, 5, 9, 12) in token order.
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(g[i * d], float(std::vector<int>{0, 2, 4, 6}[size_t(i)] * d));
  std::vector<float> grouped(g, g + N * K * d), slots(size_t(N * K * d), -1.f);
  ex.combine(key, grouped.data());
  ex.combine_wait(key, slots.data());
  for (int64_t s = 0; s < N * K; ++s)
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(slots[size_t(s * d + j)], x[size_t((s / K) * d + j)]);
  ex.release(key);
  EXPECT_THROW(ex.dispatch(key, x.data(), false), trex::Error);
}

TEST(EpExchange, SingleRankEqualsLocalExchange) {
  auto local = comm::make_local_communicator();
  for (bool hash : {false, true})
    for (bool skew : {false, true}) {
      SCOPED_TRACE(std::string(hash ? "hash" : "score") + (skew ? " skewed" : ""));
      check_moe_ep(*local, make_moe_case(12, 4, hash, skew, 21 + 2 * hash + skew), 2);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Under mpirun.

TEST(EpMpi, MoeLayerTwoRanks) { run_workers(2, "dp=2,ep=2", "EpWorker.MoeLayer*"); }
TEST(EpMpi, MoeLayerFourRanks) { run_workers(4, "dp=4,ep=4", "EpWorker.MoeLayer*"); }

// MoE layer, one EP group = the world: score and hash routing, balanced and skewed, two micro-batches in flight.
TEST(EpWorker, MoeLayer) {
  if (!worker_mode()) GTEST_SKIP() << "runs under mpirun (EpMpi.*)";
  comm::Communicator& w = world();
  for (bool hash : {false, true})
    for (bool skew : {false, true}) {
      SCOPED_TRACE(std::string(hash ? "hash" : "score") + (skew ? " skewed" : ""));
      check_moe_ep(w, make_moe_case(6 * w.size(), 8, hash, skew, 31 + 2 * hash + skew), 2);
    }
  std::printf("ep-worker ran MoeLayer on rank %d of %d\n", w.rank(), w.size());
}
