// Finite-difference (central, double) checks of every non-attention block's hand-written backward.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "fd_check.h"
#include "kernels/cpu/rmsnorm.h"
#include "model/dsv4/balance.h"
#include "model/dsv4/embedding.h"
#include "model/dsv4/head.h"
#include "model/dsv4/loss.h"
#include "model/dsv4/mhc.h"
#include "model/dsv4/moe.h"
#include "model/dsv4/mtp.h"

using namespace trex::dsv4;
using trex::test::dot;
using trex::test::fd_check;
using trex::test::randn;
using V = std::vector<double>;

TEST(Sinkhorn, ColumnsSumToOneAndRowsNearlySo) {
  std::mt19937_64 rng(1);
  for (int n : {3, 4}) {
    V logits = randn(size_t(n * n), rng, 2.0), out(size_t(n * n));
    sinkhorn_fwd(logits.data(), n, 20, 1e-6, out.data());
    for (int j = 0; j < n; ++j) {
      double c = 0, r = 0;
      for (int i = 0; i < n; ++i) c += out[size_t(i * n + j)], r += out[size_t(j * n + i)];
      EXPECT_NEAR(c, 1.0, 1e-5);
      EXPECT_NEAR(r, 1.0, 2e-2);
    }
  }
}

TEST(Sinkhorn, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 rng(2);
  const int n = 4;
  V logits = randn(16, rng, 1.5), r = randn(16, rng), out(16), g(16);
  sinkhorn_bwd(logits.data(), n, 20, 1e-6, r.data(), g.data());
  fd_check("sinkhorn", logits, g, [&] {
    sinkhorn_fwd(logits.data(), n, 20, 1e-6, out.data());
    return dot(out, r);
  }, 1e-6, 16);
}

TEST(RmsNorm, WeightedAndUnweightedBackward) {
  std::mt19937_64 rng(3);
  const int64_t n = 5, d = 12;
  V x = randn(size_t(n * d), rng), w = randn(size_t(d), rng, 0.1, 1.0), r = randn(size_t(n * d), rng);
  V y(size_t(n * d)), rstd(static_cast<size_t>(n));
  for (bool weighted : {true, false}) {
    const double* wp = weighted ? w.data() : nullptr;
    V dx(x.size(), 0.0), dw(w.size(), 0.0);
    trex::cpu::rmsnorm_fwd(y.data(), rstd.data(), x.data(), wp, n, d, 1e-6);
    trex::cpu::rmsnorm_bwd(dx.data(), weighted ? dw.data() : nullptr, r.data(), x.data(), wp, rstd.data(), n, d);
    auto loss = [&] {
      trex::cpu::rmsnorm_fwd(y.data(), rstd.data(), x.data(), wp, n, d, 1e-6);
      return dot(y, r);
    };
    fd_check("rmsnorm.x", x, dx, loss);
    if (weighted) fd_check("rmsnorm.w", w, dw, loss);
  }
}

// One mHC site end to end: collapse -> (a fixed random "sub-layer" y) -> expand; loss = <r1, collapsed> + <r2, Xout>.
TEST(Mhc, SiteAndExpandBackward) {
  for (int64_t n_hc : {4, 3}) {
    std::mt19937_64 rng(4 + uint64_t(n_hc));
    MhcShape s;
    s.n_tok = 6, s.n_hc = n_hc, s.d = 8, s.sinkhorn_iters = 20;
    const int64_t M = s.n_mix(), D = n_hc * s.d, N = s.n_tok;
    V X = randn(size_t(N * D), rng), fn = randn(size_t(M * D), rng, 0.3), base = randn(size_t(M), rng, 0.5),
      scale = randn(3, rng, 0.3, 1.0), y = randn(size_t(N * s.d), rng);
    V r1 = randn(size_t(N * s.d), rng), r2 = randn(size_t(N * D), rng);
    V mix(size_t(N * M)), rstd(static_cast<size_t>(N)), pre(size_t(N * n_hc)), post(size_t(N * n_hc)),
        comb(size_t(N * n_hc * n_hc)), col(size_t(N * s.d)), Xo(size_t(N * D));
    MhcSiteActs<double> a{mix.data(), rstd.data(), pre.data(), post.data(), comb.data()};
    auto loss = [&] {
      mhc_site_fwd(s, X.data(), fn.data(), base.data(), scale.data(), a, col.data());
      mhc_expand_fwd(s, X.data(), y.data(), post.data(), comb.data(), Xo.data());
      return dot(col, r1) + dot(Xo, r2);
    };
    loss();
    V dX(X.size(), 0.0), dy(y.size(), 0.0), dpost(post.size()), dcomb(comb.size()), dfn(fn.size(), 0.0),
        dbase(base.size(), 0.0), dscale(3, 0.0), scratch(size_t(N * M));
    mhc_expand_bwd(s, X.data(), y.data(), post.data(), comb.data(), r2.data(), dX.data(), dy.data(), dpost.data(),
                   dcomb.data());
    mhc_site_bwd(s, X.data(), fn.data(), base.data(), scale.data(), a, r1.data(), dpost.data(), dcomb.data(),
                 dX.data(), dfn.data(), dbase.data(), dscale.data(), scratch.data());
    fd_check("mhc.X", X, dX, loss);
    fd_check("mhc.y", y, dy, loss);
    fd_check("mhc.fn", fn, dfn, loss);
    fd_check("mhc.base", base, dbase, loss, 1e-6, 64);
    fd_check("mhc.scale", scale, dscale, loss);
  }
}

TEST(Mhc, HcHeadBackward) {
  std::mt19937_64 rng(6);
  MhcShape s;
  s.n_tok = 5, s.n_hc = 4, s.d = 8;
  const int64_t n = s.n_hc, D = n * s.d, N = s.n_tok;
  V X = randn(size_t(N * D), rng), fn = randn(size_t(n * D), rng, 0.3), base = randn(size_t(n), rng, 0.5),
    scale = {0.8}, r = randn(size_t(N * s.d), rng);
  V mix(size_t(N * n)), rstd(static_cast<size_t>(N)), w(size_t(N * n)), y(size_t(N * s.d));
  auto loss = [&] {
    hc_head_fwd(s, X.data(), fn.data(), base.data(), scale.data(), mix.data(), rstd.data(), w.data(), y.data());
    return dot(y, r);
  };
  loss();
  V dX(X.size(), 0.0), dfn(fn.size(), 0.0), dbase(size_t(n), 0.0), dscale(1, 0.0), scratch(size_t(N * n));
  hc_head_bwd(s, X.data(), fn.data(), base.data(), scale.data(), mix.data(), rstd.data(), w.data(), r.data(),
              dX.data(), dfn.data(), dbase.data(), dscale.data(), scratch.data());
  fd_check("hc_head.X", X, dX, loss);
  fd_check("hc_head.fn", fn, dfn, loss);
  fd_check("hc_head.base", base, dbase, loss);
  fd_check("hc_head.scale", scale, dscale, loss);
}

namespace {

struct MoeCase {
  MoeShape s;
  V gate, w1, w3, w2, sw1, sw3, sw2, u, r;
  std::vector<float> bias;
  std::vector<int32_t> tid2eid, ids;
  int64_t vocab = 11;
};

MoeCase make_moe(bool hash, double limit, uint64_t seed) {
  std::mt19937_64 rng(seed);
  MoeCase c;
  c.s.n_tok = 7, c.s.d = 6, c.s.n_experts = 5, c.s.topk = 2, c.s.inter = 4, c.s.shared_inter = 4;
  c.s.routed_scale = 1.5, c.s.swiglu_limit = limit, c.s.hash = hash;
  const auto& s = c.s;
  c.gate = randn(size_t(s.n_experts * s.d), rng, 0.8);
  c.w1 = randn(size_t(s.n_experts * s.inter * s.d), rng, 0.6);
  c.w3 = randn(size_t(s.n_experts * s.inter * s.d), rng, 0.6);
  c.w2 = randn(size_t(s.n_experts * s.d * s.inter), rng, 0.6);
  c.sw1 = randn(size_t(s.shared_inter * s.d), rng, 0.6);
  c.sw3 = randn(size_t(s.shared_inter * s.d), rng, 0.6);
  c.sw2 = randn(size_t(s.d * s.shared_inter), rng, 0.6);
  c.u = randn(size_t(s.n_tok * s.d), rng);
  c.r = randn(size_t(s.n_tok * s.d), rng);
  for (int64_t e = 0; e < s.n_experts; ++e) c.bias.push_back(float(0.3 * std::sin(double(e) * 1.7)));
  std::uniform_int_distribution<int> ue(0, int(s.n_experts) - 1), ut(0, int(c.vocab) - 1);
  for (int64_t v = 0; v < c.vocab; ++v) {
    int a = ue(rng), b = ue(rng);
    while (b == a) b = ue(rng);
    c.tid2eid.push_back(a), c.tid2eid.push_back(b);
  }
  for (int64_t t = 0; t < s.n_tok; ++t) c.ids.push_back(ut(rng));
  return c;
}

void run_moe_fd(MoeCase& c, bool expect_clamped, double balance_alpha) {
  const MoeShape& s = c.s;
  auto sizes = moe_act_sizes(s);
  V tbuf(size_t(sizes.t_elems));
  std::vector<int32_t> ibuf(size_t(sizes.i32_elems));
  MoeActs<double> a = moe_acts_bind(s, tbuf.data(), ibuf.data());
  MoeWeights<double> w{c.gate.data(), c.w1.data(), c.w3.data(), c.w2.data(), c.sw1.data(), c.sw3.data(),
                       c.sw2.data(), s.hash ? nullptr : c.bias.data(), c.tid2eid.data(), c.vocab};
  V out(size_t(s.n_tok * s.d));
  const int64_t B = 1, T = s.n_tok;
  auto loss = [&] {
    moe_fwd(s, w, c.u.data(), c.ids.data(), a, out.data());
    return dot(out, c.r) + balance_loss<double>(a.scores, a.sel, B, T, s.n_experts, s.topk, balance_alpha, nullptr);
  };
  loss();
  const std::vector<int32_t> sel0(a.sel, a.sel + s.n_tok * s.topk);
  // Clamp coverage: the case must (or must not) exercise the clamps, and no value may sit near a clamp edge.
  int64_t clamped = 0;
  for (int64_t i = 0; i < s.n_tok * s.topk * s.inter; ++i) {
    if (s.swiglu_limit <= 0) break;
    const double L = s.swiglu_limit;
    clamped += a.gate_pre[i] > L || std::fabs(a.up_pre[i]) > L;
    ASSERT_GT(std::fabs(a.gate_pre[i] - L), 1e-3);
    ASSERT_GT(std::fabs(std::fabs(a.up_pre[i]) - L), 1e-3);
  }
  if (expect_clamped)
    EXPECT_GT(clamped, 0);
  else
    EXPECT_EQ(clamped, 0);
  V dscores(size_t(s.n_tok * s.n_experts));
  balance_loss<double>(a.scores, a.sel, B, T, s.n_experts, s.topk, balance_alpha, dscores.data());
  V du(c.u.size(), 0.0), dgate(c.gate.size(), 0.0), dw1(c.w1.size(), 0.0), dw3(c.w3.size(), 0.0),
      dw2(c.w2.size(), 0.0), dsw1(c.sw1.size(), 0.0), dsw3(c.sw3.size(), 0.0), dsw2(c.sw2.size(), 0.0);
  MoeGrads<double> g{dgate.data(), dw1.data(), dw3.data(), dw2.data(), dsw1.data(), dsw3.data(), dsw2.data()};
  moe_bwd(s, w, c.u.data(), a, c.r.data(), balance_alpha != 0 ? dscores.data() : nullptr, du.data(), g);
  auto checked = [&] {
    const double l = loss();
    for (size_t i = 0; i < sel0.size(); ++i)
      if (!s.hash && a.sel[i] != sel0[i]) ADD_FAILURE() << "routing changed under the FD step: pick another seed";
    return l;
  };
  fd_check("moe.u", c.u, du, checked);
  fd_check("moe.gate", c.gate, dgate, checked);
  fd_check("moe.w1", c.w1, dw1, checked, 1e-6, 64);
  fd_check("moe.w3", c.w3, dw3, checked, 1e-6, 64);
  fd_check("moe.w2", c.w2, dw2, checked, 1e-6, 64);
  fd_check("moe.sw1", c.sw1, dsw1, checked);
  fd_check("moe.sw3", c.sw3, dsw3, checked);
  fd_check("moe.sw2", c.sw2, dsw2, checked);
}

}  // namespace

TEST(Moe, ScoreRoutingClampsActive) {
  auto c = make_moe(false, 0.9, 11);
  run_moe_fd(c, true, 0.0);
}
TEST(Moe, ScoreRoutingClampsInactive) {
  auto c = make_moe(false, 50.0, 12);
  run_moe_fd(c, false, 0.0);
}
TEST(Moe, HashRoutingClampsActive) {
  auto c = make_moe(true, 0.9, 13);
  run_moe_fd(c, true, 0.0);
}
TEST(Moe, HashRoutingNoClamp) {
  auto c = make_moe(true, 0.0, 14);
  run_moe_fd(c, false, 0.0);
}
TEST(Moe, BalanceLossGradientThroughRouter) {
  auto c = make_moe(false, 0.9, 15);
  run_moe_fd(c, true, 0.37);
}

TEST(Moe, HashSelectionFollowsTable) {
  auto c = make_moe(true, 0.9, 16);
  auto sizes = moe_act_sizes(c.s);
  V tbuf(size_t(sizes.t_elems)), out(size_t(c.s.n_tok * c.s.d));
  std::vector<int32_t> ibuf(size_t(sizes.i32_elems));
  MoeActs<double> a = moe_acts_bind(c.s, tbuf.data(), ibuf.data());
  MoeWeights<double> w{c.gate.data(), c.w1.data(), c.w3.data(), c.w2.data(), c.sw1.data(), c.sw3.data(),
                       c.sw2.data(), nullptr, c.tid2eid.data(), c.vocab};
  moe_fwd(c.s, w, c.u.data(), c.ids.data(), a, out.data());
  for (int64_t t = 0; t < c.s.n_tok; ++t) {
    double wsum = 0;
    for (int64_t k = 0; k < 2; ++k) {
      EXPECT_EQ(a.sel[t * 2 + k], c.tid2eid[size_t(c.ids[size_t(t)] * 2 + k)]);
      wsum += a.weight[t * 2 + k];
    }
    EXPECT_NEAR(wsum, 1.5, 1e-12);  // normalised over the selected, times the routed scale
  }
  std::vector<int64_t> load(5);
  moe_expert_load(a.sel, c.s.n_tok, 2, 5, load.data());
  int64_t total = 0;
  for (auto l : load) total += l;
  EXPECT_EQ(total, c.s.n_tok * 2);
  std::vector<float> bias(5, 0.f);
  router_bias_update(bias.data(), load.data(), 5, 0.001);
  for (int e = 0; e < 5; ++e) {
    const double mean = double(total) / 5;
    if (double(load[size_t(e)]) > mean) EXPECT_FLOAT_EQ(bias[size_t(e)], -0.001f);
    if (double(load[size_t(e)]) < mean) EXPECT_FLOAT_EQ(bias[size_t(e)], 0.001f);
  }
}

TEST(Loss, ShiftedTargetsMaskAndDocuments) {
  // Row 0: labels 5 6 -100 7; row 1: two documents [0,2) and [2,4).
  std::vector<int32_t> labels = {5, 6, -100, 7, 1, 2, 3, 4};
  std::vector<int64_t> doc_start = {0, 0, 0, 0, 0, 0, 2, 2};
  auto t = shifted_targets(labels.data(), doc_start.data(), 2, 4, 1, 10);
  EXPECT_EQ(t, (std::vector<int32_t>{6, -1, 7, -1, 2, -1, 4, -1}));
  auto t2 = shifted_targets(labels.data(), nullptr, 2, 4, 2, 10);
  EXPECT_EQ(t2, (std::vector<int32_t>{-1, 7, -1, -1, 3, 4, -1, -1}));
  EXPECT_THROW(shifted_targets(labels.data(), nullptr, 2, 4, 1, 5), trex::Error);
}

TEST(Loss, CrossEntropyIsOneMeanAndBackwardMatches) {
  std::mt19937_64 rng(21);
  const int64_t n = 6, vocab = 9;
  V logits = randn(size_t(n * vocab), rng, 2.0), lse(static_cast<size_t>(n)), dl(logits.size());
  std::vector<int32_t> targets = {3, -1, 0, 8, -1, 5};
  int64_t count = 0;
  const double l = lm_loss_fwd(logits.data(), targets.data(), n, vocab, lse.data(), &count);
  EXPECT_EQ(count, 4);
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (targets[size_t(i)] < 0) continue;
    double s = 0;
    for (int64_t v = 0; v < vocab; ++v) s += std::exp(logits[size_t(i * vocab + v)]);
    ref += std::log(s) - logits[size_t(i * vocab + targets[size_t(i)])];
  }
  EXPECT_NEAR(l, ref / 4, 1e-12);
  lm_loss_bwd(logits.data(), lse.data(), targets.data(), n, vocab, count, 0.3, dl.data());
  fd_check("ce.logits", logits, dl, [&] {
    int64_t c = 0;
    return 0.3 * lm_loss_fwd(logits.data(), targets.data(), n, vocab, lse.data(), &c);
  }, 1e-6, 54);
}

TEST(Balance, LossValueAndGradient) {
  std::mt19937_64 rng(22);
  const int64_t B = 2, T = 5, E = 4, K = 2;
  V scores = randn(size_t(B * T * E), rng, 0.3, 1.0), ds(scores.size());
  std::vector<int32_t> sel;
  for (int64_t t = 0; t < B * T; ++t) sel.push_back(int32_t(t % E)), sel.push_back(int32_t((t + 1) % E));
  const double alpha = 0.5;
  const double l = balance_loss(scores.data(), sel.data(), B, T, E, K, alpha, ds.data());
  // A perfectly uniform router gives f_e = 1 on average and P_e = 1/E: the loss is near alpha.
  EXPECT_GT(l, 0.0);
  fd_check("balance.scores", scores, ds, [&] {
    return balance_loss<double>(scores.data(), sel.data(), B, T, E, K, alpha, nullptr);
  }, 1e-6, 40);
  V uniform(scores.size(), 1.0);
  EXPECT_NEAR(balance_loss<double>(uniform.data(), sel.data(), B, T, E, K, alpha, nullptr), alpha, 1e-12);
}

TEST(Head, HcHeadNormLmHeadBackward) {
  std::mt19937_64 rng(23);
  MhcShape s;
  s.n_tok = 4, s.n_hc = 3, s.d = 6;
  const int64_t vocab = 7, N = s.n_tok, D = s.n_hc * s.d;
  V X = randn(size_t(N * D), rng), fn = randn(size_t(s.n_hc * D), rng, 0.3), base = randn(3, rng, 0.3),
    scale = {1.1}, norm = randn(size_t(s.d), rng, 0.1, 1.0), head = randn(size_t(vocab * s.d), rng, 0.5);
  V buf(size_t(head_act_elems(N, s.n_hc, s.d))), logits(size_t(N * vocab)), lse(static_cast<size_t>(N)), dl(logits.size());
  HeadParams<double> p{fn.data(), base.data(), scale.data(), norm.data(), head.data()};
  HeadActs<double> a = head_acts_bind(N, s.n_hc, s.d, buf.data(), logits.data());
  std::vector<int32_t> tg = {1, 4, -1, 6};
  auto loss = [&] {
    head_fwd(s, vocab, X.data(), p, a);
    int64_t c;
    return lm_loss_fwd(logits.data(), tg.data(), N, vocab, lse.data(), &c);
  };
  loss();
  lm_loss_bwd(logits.data(), lse.data(), tg.data(), N, vocab, 3, 1.0, dl.data());
  V dX(X.size(), 0.0), dfn(fn.size(), 0.0), dbase(3, 0.0), dscale(1, 0.0), dnorm(norm.size(), 0.0),
      dhead(head.size(), 0.0), scratch(size_t(N * (s.d + s.n_hc)));
  HeadGrads<double> g{dfn.data(), dbase.data(), dscale.data(), dnorm.data(), dhead.data()};
  head_bwd(s, vocab, X.data(), p, a, dl.data(), dX.data(), g, scratch.data());
  fd_check("head.X", X, dX, loss);
  fd_check("head.hc_fn", fn, dfn, loss);
  fd_check("head.hc_base", base, dbase, loss);
  fd_check("head.hc_scale", scale, dscale, loss);
  fd_check("head.norm", norm, dnorm, loss);
  fd_check("head.head", head, dhead, loss);
}

TEST(Mtp, InputBackward) {
  std::mt19937_64 rng(24);
  const int64_t N = 5, n_hc = 3, d = 6, vocab = 8;
  V XL = randn(size_t(N * n_hc * d), rng), embed = randn(size_t(vocab * d), rng),
    enorm = randn(size_t(d), rng, 0.1, 1.0), hnorm = randn(size_t(d), rng, 0.1, 1.0),
    ep = randn(size_t(d * d), rng, 0.4), hp = randn(size_t(d * d), rng, 0.4), r = randn(size_t(N * n_hc * d), rng);
  std::vector<int32_t> next = {3, 7, 0, 3, -1};
  V buf(size_t(mtp_input_act_elems(N, n_hc, d))), Xm(size_t(N * n_hc * d));
  MtpInputParams<double> p{enorm.data(), hnorm.data(), ep.data(), hp.data()};
  MtpInputActs<double> a = mtp_input_acts_bind(N, n_hc, d, buf.data());
  auto loss = [&] {
    mtp_input_fwd(N, n_hc, d, 1e-6, next.data(), embed.data(), vocab, XL.data(), p, a, Xm.data());
    return dot(Xm, r);
  };
  loss();
  V dXL(XL.size(), 0.0), demb(embed.size(), 0.0), denorm(size_t(d), 0.0), dhnorm(size_t(d), 0.0),
      dep(ep.size(), 0.0), dhp(hp.size(), 0.0);
  MtpInputGrads<double> g{denorm.data(), dhnorm.data(), dep.data(), dhp.data()};
  mtp_input_bwd(N, n_hc, d, next.data(), XL.data(), p, a, r.data(), dXL.data(), demb.data(), g);
  fd_check("mtp.XL", XL, dXL, loss);
  fd_check("mtp.embed", embed, demb, loss);
  fd_check("mtp.enorm", enorm, denorm, loss);
  fd_check("mtp.hnorm", hnorm, dhnorm, loss);
  fd_check("mtp.e_proj", ep, dep, loss);
  fd_check("mtp.h_proj", hp, dhp, loss);
}

TEST(Embedding, StreamsForwardBackward) {
  const int64_t vocab = 4, d = 3, n_hc = 2;
  V table = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  std::vector<int32_t> ids = {2, 0, 2};
  V X(size_t(3 * n_hc * d)), dX(X.size(), 1.0), dt(table.size(), 0.0);
  embed_streams_fwd(ids.data(), 3, table.data(), vocab, d, n_hc, X.data());
  EXPECT_EQ(X[0], 6);
  EXPECT_EQ(X[3], 6);
  EXPECT_EQ(X[6], 0);
  embed_streams_bwd(ids.data(), 3, d, n_hc, dX.data(), dt.data());
  EXPECT_EQ(dt[6], 4.0);  // token 2 twice, 2 streams each
  EXPECT_EQ(dt[0], 2.0);
  EXPECT_EQ(dt[3], 0.0);
  std::vector<int32_t> bad = {4};
  EXPECT_THROW(embed_streams_fwd(bad.data(), 1, table.data(), vocab, d, n_hc, X.data()), trex::Error);
}

TEST(FdCheck, DetectsAWrongGradient) {
  V x = {0.3, -1.2, 0.7};
  V wrong = {2 * 0.3, 2 * -1.2, 2 * 0.7 + 0.01};  // d/dx sum x^2, last entry off by 0.01
  EXPECT_NONFATAL_FAILURE(fd_check("wrong", x, wrong, [&] { return dot(x, x); }), "wrong[2]");
}
