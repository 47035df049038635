// One set of checks for every communicator backend (local, threads on host or device memory, NCCL): each case
// runs on every rank of an n-rank group against the same computation done on the host. A backend names what it
// supports (tags, rank-order reductions, bf16); the memory kind (host or device buffers) is a Mem.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/rank_threads.h"

namespace trex::testing {

// Where a case's buffers live.
struct Mem {
  virtual ~Mem() = default;
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual void put(void* dst, const void* src, size_t bytes) = 0;  // host -> buffer
  virtual void get(void* dst, const void* src, size_t bytes) = 0;  // buffer -> host (after the queued work)
};

struct HostMem final : Mem {
  void* alloc(size_t bytes) override { return ::operator new(bytes ? bytes : 1); }
  void release(void* p) override { ::operator delete(p); }
  void put(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
  void get(void* d, const void* s, size_t n) override { std::memcpy(d, s, n); }
};

struct CommBackend {
  std::string name;     // the test's label
  std::string backend;  // what Communicator::backend() says
  int ranks = 2;
  // Given the group size, returns rank r's communicator maker (called on rank r's thread).
  std::function<std::function<std::unique_ptr<comm::Communicator>(int)>(int)> group;
  std::function<std::unique_ptr<Mem>()> mem;
  bool p2p = true;         // send / recv
  bool tags = true;        // send / recv match by tag (NCCL: issue order only)
  bool rank_order = true;  // reductions fold ranks 0..n-1 left to right (bitwise checks)
  bool bf16 = true;
  std::function<std::string()> unavailable;  // non-empty answer: why this machine cannot run it (skipped)
};

inline void PrintTo(const CommBackend& b, std::ostream* os) { *os << b.name << " x" << b.ranks; }

inline std::string backend_label(const ::testing::TestParamInfo<CommBackend>& i) {
  return i.param.name + std::to_string(i.param.ranks);
}

// A typed buffer of one rank in the backend's memory.
template <typename T>
class Buf {
 public:
  Buf(Mem& m, size_t n) : m_(m), n_(n), p_(static_cast<T*>(m.alloc(n * sizeof(T)))) {}
  Buf(Mem& m, const std::vector<T>& h) : Buf(m, h.size()) { set(h); }
  ~Buf() { m_.release(p_); }
  Buf(const Buf&) = delete;
  void set(const std::vector<T>& h) { m_.put(p_, h.data(), h.size() * sizeof(T)); }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    m_.get(h.data(), p_, n_ * sizeof(T));
    return h;
  }
  T* get() const { return p_; }

 private:
  Mem& m_;
  size_t n_;
  T* p_;
};

// Exact in fp32 / bf16 sums of a few ranks (small integers / 8).
inline float exact_val(int rank, size_t i) { return float((int(i * 7 + 3 * rank) % 29) - 14) / 8.f; }
// Values whose fp32 sum depends on the order (different magnitudes and signs).
inline float order_val(int rank, size_t i) {
  return float(std::pow(1.37, double((rank * 7 + int(i)) % 23))) * (((rank + int(i)) % 2) ? 1.f : -1.f) / 3.f;
}
inline uint16_t to_bf16(float f) {  // exact for exact_val
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);
}
inline float from_bf16(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every collective and point-to-point operation on rank c.rank() of c.size().
inline void check_collectives(const CommBackend& be, comm::Communicator& c, Mem& mem) {
  using comm::ElemType;
  using comm::ReduceOp;
  const int n = c.size(), r = c.rank();
  const size_t blk = 1000;  // per-rank block of reduce_scatter / all_gather
  ASSERT_EQ(c.backend(), be.backend);
  // all_reduce: sum, max, min (fp32), and the fold order.
  {
    std::vector<float> h(n * blk);
    for (size_t i = 0; i < h.size(); ++i) h[i] = exact_val(r, i);
    Buf<float> d(mem, h);
    c.all_reduce(d.get(), h.size(), ElemType::F32, ReduceOp::Sum)->wait();
    std::vector<float> got = d.host();
    for (size_t i = 0; i < h.size(); ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += exact_val(q, i);
      ASSERT_EQ(got[i], want) << "all_reduce sum at " << i;
    }
    for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
      d.set(h);
      c.all_reduce(d.get(), h.size(), ElemType::F32, op)->wait();
      got = d.host();
      for (size_t i = 0; i < h.size(); ++i) {
        float want = exact_val(0, i);
        for (int q = 1; q < n; ++q) want = op == ReduceOp::Max ? std::max(want, exact_val(q, i)) : std::min(want, exact_val(q, i));
        ASSERT_EQ(got[i], want) << (op == ReduceOp::Max ? "max" : "min") << " at " << i;
      }
    }
    if (be.rank_order) {
      for (size_t i = 0; i < h.size(); ++i) h[i] = order_val(r, i);
      d.set(h);
      c.all_reduce(d.get(), h.size(), ElemType::F32, ReduceOp::Sum)->wait();
      got = d.host();
      for (size_t i = 0; i < h.size(); ++i) {
        float want = order_val(0, i);
        for (int q = 1; q < n; ++q) want += order_val(q, i);
        ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << "all_reduce not in rank order at " << i << ": " << got[i]
                                                      << " vs " << want;
      }
    }
  }
  // all_reduce of other types: f64 sum, i64 max, i32 sum.
  {
    std::vector<double> hd(64);
    std::vector<int64_t> hl(64);
    std::vector<int32_t> hi(64);
    for (size_t i = 0; i < 64; ++i) hd[i] = double(exact_val(r, i)) * 1e-3, hl[i] = int64_t(i) * (r + 1) - 7 * r, hi[i] = int32_t(i) + r;
    Buf<double> dd(mem, hd);
    Buf<int64_t> dl(mem, hl);
    Buf<int32_t> di(mem, hi);
    c.all_reduce(dd.get(), 64, ElemType::F64, ReduceOp::Sum)->wait();
    c.all_reduce(dl.get(), 64, ElemType::I64, ReduceOp::Max)->wait();
    c.all_reduce(di.get(), 64, ElemType::I32, ReduceOp::Sum)->wait();
    const auto gd = dd.host();
    const auto gl = dl.host();
    const auto gi = di.host();
    for (size_t i = 0; i < 64; ++i) {
      double wd = 0;
      int64_t wl = INT64_MIN;
      int32_t wi = 0;
      for (int q = 0; q < n; ++q)
        wd += double(exact_val(q, i)) * 1e-3, wl = std::max(wl, int64_t(i) * (q + 1) - 7 * q), wi += int32_t(i) + q;
      ASSERT_NEAR(gd[i], wd, 1e-15) << "f64 sum at " << i;
      ASSERT_EQ(gl[i], wl) << "i64 max at " << i;
      ASSERT_EQ(gi[i], wi) << "i32 sum at " << i;
    }
  }
  // reduce_scatter (fp32, then bf16 in place as the gradient path calls it): rank r gets block r of the sum.
  {
    std::vector<float> h(n * blk);
    for (size_t i = 0; i < h.size(); ++i) h[i] = exact_val(r, i);
    Buf<float> s(mem, h), out(mem, blk);
    c.reduce_scatter(s.get(), out.get(), blk, ElemType::F32, ReduceOp::Sum)->wait();
    const auto got = out.host();
    for (size_t i = 0; i < blk; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += exact_val(q, r * blk + i);
      ASSERT_EQ(got[i], want) << "reduce_scatter at " << i;
    }
    if (be.bf16) {
      std::vector<uint16_t> hb(n * blk);
      for (size_t i = 0; i < hb.size(); ++i) hb[i] = to_bf16(exact_val(r, i));
      Buf<uint16_t> db(mem, hb);
      c.reduce_scatter(db.get(), db.get() + r * blk, blk, ElemType::BF16, ReduceOp::Sum)->wait();
      const auto gb = db.host();
      for (size_t i = 0; i < blk; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += exact_val(q, r * blk + i);
        ASSERT_EQ(from_bf16(gb[r * blk + i]), want) << "bf16 reduce_scatter in place at " << i;
      }
    }
  }
  // all_gather, then in place (the optimiser's bf16 gather of updated slices).
  {
    std::vector<float> mine(blk);
    for (size_t i = 0; i < blk; ++i) mine[i] = exact_val(r, i) + 100.f * float(r);
    Buf<float> s(mem, mine), out(mem, n * blk);
    c.all_gather(s.get(), out.get(), blk, ElemType::F32)->wait();
    auto got = out.host();
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < blk; ++i) ASSERT_EQ(got[q * blk + i], exact_val(q, i) + 100.f * float(q)) << "all_gather";
    std::vector<float> full(n * blk, -1.f);
    std::copy(mine.begin(), mine.end(), full.begin() + r * blk);
    out.set(full);
    c.all_gather(out.get() + r * blk, out.get(), blk, ElemType::F32)->wait();
    got = out.host();
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < blk; ++i)
        ASSERT_EQ(got[q * blk + i], exact_val(q, i) + 100.f * float(q)) << "in-place all_gather";
    // broadcast from the last rank.
    c.broadcast(s.get(), blk * 4, n - 1)->wait();
    got = s.host();
    for (size_t i = 0; i < blk; ++i) ASSERT_EQ(got[i], exact_val(n - 1, i) + 100.f * float(n - 1)) << "broadcast";
  }
  // all_to_all_v with uneven blocks, some empty: rank p sends bytes(p, q) to q (none from 1 to 0).
  {
    auto bytes = [](int from, int to) -> size_t { return from == 1 && to == 0 ? 0 : size_t((to + 1) * (from + 2) * 12); };
    std::vector<size_t> sb(n), so(n), rb(n), ro(n);
    size_t st = 0, rt = 0;
    for (int q = 0; q < n; ++q) {
      sb[q] = bytes(r, q), so[q] = st, st += sb[q];
      rb[q] = bytes(q, r), ro[q] = rt, rt += rb[q];
    }
    std::vector<uint8_t> sh(st);
    for (size_t i = 0; i < st; ++i) sh[i] = uint8_t(i * 13 + 50 * r);
    Buf<uint8_t> ds(mem, sh), dr(mem, std::vector<uint8_t>(rt, 0));
    c.all_to_all_v(ds.get(), sb, so, dr.get(), rb, ro)->wait();
    const auto rh = dr.host();
    for (int q = 0; q < n; ++q) {
      size_t q_off = 0;  // where q's block for r starts in q's send buffer
      for (int t = 0; t < r; ++t) q_off += bytes(q, t);
      for (size_t i = 0; i < rb[q]; ++i)
        ASSERT_EQ(rh[ro[q] + i], uint8_t((q_off + i) * 13 + 50 * q)) << "all_to_all_v from " << q << " byte " << i;
    }
  }
  // send / recv around the ring; with tags, two messages per pair posted in opposite orders on the two sides.
  if (be.p2p && n > 1) {
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<float> a(blk), b(blk);
    for (size_t i = 0; i < blk; ++i) a[i] = exact_val(r, i), b[i] = -exact_val(r, i) - 1.f;
    Buf<float> sa(mem, a), sb2(mem, b), ra(mem, blk), rb2(mem, blk);
    comm::WorkPtr w[4];
    if (!be.tags && r % 2 == 1) w[2] = c.recv(ra.get(), blk * 4, prev, 7);  // NCCL: a ring must alternate
    w[0] = c.send(sa.get(), blk * 4, next, 7);
    if (be.tags) {
      w[1] = c.send(sb2.get(), blk * 4, next, 9);
      w[2] = c.recv(rb2.get(), blk * 4, prev, 9);  // the second message first
      w[3] = c.recv(ra.get(), blk * 4, prev, 7);
    } else if (r % 2 == 0) {
      w[3] = c.recv(ra.get(), blk * 4, prev, 7);
    }
    for (auto& x : w)
      if (x) x->wait();
    const auto ga = ra.host();
    for (size_t i = 0; i < blk; ++i) ASSERT_EQ(ga[i], exact_val(prev, i)) << "recv tag 7 at " << i;
    if (be.tags) {
      const auto gb = rb2.host();
      for (size_t i = 0; i < blk; ++i) ASSERT_EQ(gb[i], -exact_val(prev, i) - 1.f) << "recv tag 9 at " << i;
    }
  }
  c.barrier();
}

// Rank r's communicators of a thread group made once for the whole group.
inline std::function<std::unique_ptr<comm::Communicator>(int)> shared_group(
    std::vector<std::unique_ptr<comm::Communicator>> comms) {
  auto all = std::make_shared<std::vector<std::unique_ptr<comm::Communicator>>>(std::move(comms));
  return [all](int r) { return std::move((*all)[size_t(r)]); };
}

// split: one group with the keys reversed (ranks in reverse order), then groups by parity.
inline void check_split(comm::Communicator& c, Mem& mem) {
  const int n = c.size(), r = c.rank();
  auto rev = c.split(0, n - 1 - r);
  ASSERT_TRUE(rev);
  EXPECT_EQ(rev->size(), n);
  EXPECT_EQ(rev->rank(), n - 1 - r);
  auto par = c.split(r % 2, r);
  ASSERT_TRUE(par);
  EXPECT_EQ(par->size(), (n + 1 - r % 2) / 2);
  EXPECT_EQ(par->rank(), r / 2);
  Buf<float> d(mem, std::vector<float>{float(r + 1)});
  rev->all_reduce(d.get(), 1, comm::ElemType::F32, comm::ReduceOp::Sum)->wait();
  EXPECT_EQ(d.host()[0], float(n * (n + 1) / 2));
  d.set({float(r + 1)});
  par->all_reduce(d.get(), 1, comm::ElemType::F32, comm::ReduceOp::Sum)->wait();
  float want = 0;
  for (int q = r % 2; q < n; q += 2) want += float(q + 1);
  EXPECT_EQ(d.host()[0], want);
  // The reversed group's rank 0 (parent rank n-1) broadcasts.
  d.set({float(100 + r)});
  rev->broadcast(d.get(), 4, 0)->wait();
  EXPECT_EQ(d.host()[0], float(100 + n - 1));
}

class CommCases : public ::testing::TestWithParam<CommBackend> {
 protected:
  void run(const std::function<void(const CommBackend&, comm::Communicator&, Mem&)>& fn) {
    const CommBackend& be = GetParam();
    if (be.unavailable) {
      const std::string why = be.unavailable();
      if (!why.empty()) GTEST_SKIP() << why;
    }
    auto make = be.group(be.ranks);
    run_ranks(be.ranks, [&](int r) {
      auto c = make(r);
      auto mem = be.mem();
      fn(be, *c, *mem);
    });
  }
};

}  // namespace trex::testing
