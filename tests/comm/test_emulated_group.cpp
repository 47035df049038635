// The emulated rank's communicator (comm/emulated_group.h) on host buffers: what each operation leaves in the
// buffers (rank R's own data where the real collective would put every rank's) and the bytes it counts (what rank
// R sends in the real collective of that size).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "comm/emulated_group.h"
#include "comm/uniform_fill.h"
#include "core/error.h"

namespace {

using trex::comm::ElemType;
using trex::comm::EmulatedGroup;
using trex::comm::ReduceOp;

std::vector<float> iota(size_t n, float from) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(EmulatedGroup, CollectivesMoveTheRanksOwnDataAtTheRealSizes) {
  EmulatedGroup g(2, 4, "dp");  // rank 2 of 4
  EXPECT_EQ(g.rank(), 2);
  EXPECT_EQ(g.size(), 4);
  EXPECT_EQ(g.backend(), "emulated");

  // all_reduce in place: the buffer keeps this rank's values.
  std::vector<float> a = iota(6, 1.f);
  g.all_reduce(a.data(), a.size(), ElemType::F32, ReduceOp::Sum)->wait();
  EXPECT_EQ(a, iota(6, 1.f));

  // all_gather: the own chunk in the own block (rank 2: elements [6, 9)); the other blocks keep their values.
  std::vector<float> chunk = iota(3, 10.f), gathered(12, -1.f);
  g.all_gather(chunk.data(), gathered.data(), 3, ElemType::F32)->wait();
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(gathered[size_t(r * 3 + i)], r == 2 ? 10.f + float(i) : -1.f) << "block " << r;

  // reduce_scatter: this rank's block (rank 2: elements [6, 9)) of the send buffer.
  std::vector<float> send = iota(12, 0.f), recv(3, -1.f);
  g.reduce_scatter(send.data(), recv.data(), 3, ElemType::F32, ReduceOp::Sum)->wait();
  EXPECT_EQ(recv, (std::vector<float>{6.f, 7.f, 8.f}));
  // In place, as the GPU model's ZeRO-1 buckets do it (recv = own slice of send): unchanged.
  g.reduce_scatter(send.data(), send.data() + 6, 3, ElemType::F32, ReduceOp::Sum)->wait();
  EXPECT_EQ(send, iota(12, 0.f));

  // all_to_all_v: block p of send arrives in recv block p (its own chunks back, min of the two sizes).
  std::vector<uint8_t> s8(10), r8(10, 0xff);
  std::iota(s8.begin(), s8.end(), uint8_t(1));
  const std::vector<size_t> sb = {1, 2, 3, 4}, so = {0, 1, 3, 6}, rb = {1, 2, 3, 4}, ro = {7, 8, 0, 3};
  g.all_to_all_v(s8.data(), sb, so, r8.data(), rb, ro)->wait();
  EXPECT_EQ(r8, (std::vector<uint8_t>{4, 5, 6, 7, 8, 9, 10, 1, 2, 3}));
  // Blocks that follow each other on both sides move together, but a block cut short by its receive size ends the
  // run: the next block starts at its own send offset.
  std::vector<uint8_t> r4(4, 0xff);
  g.all_to_all_v(s8.data(), {2, 2, 1, 1}, {0, 2, 4, 5}, r4.data(), {1, 2, 1, 0}, {0, 1, 3, 4})->wait();
  EXPECT_EQ(r4, (std::vector<uint8_t>{1, 3, 4, 5}));

  const auto& st = g.stats();
  EXPECT_EQ(st.at("all_reduce").calls, 1);
  EXPECT_EQ(st.at("all_reduce").bytes, 24);         // the buffer
  EXPECT_EQ(st.at("all_gather").bytes, 12);         // the send chunk
  EXPECT_EQ(st.at("reduce_scatter").calls, 2);
  EXPECT_EQ(st.at("reduce_scatter").bytes, 2 * 48);  // the whole send buffer, each call
  EXPECT_EQ(st.at("all_to_all_v").bytes, 1 + 2 + 4 + 2 + 2 + 1);  // to the peers other than rank 2, both calls
  EXPECT_EQ(g.loopback_bytes(), 0);
}

TEST(EmulatedGroup, CountOnlyMovesNoLargeCollectivePayloadButCountsTheSameBytes) {
  EmulatedGroup copy(1, 2, "ep"), none(1, 2, "ep", EmulatedGroup::SplitRule{}, EmulatedGroup::Payload::CountOnly);
  const size_t big = EmulatedGroup::kCountOnlyMovesBelow / sizeof(float);  // floats per rank: 2x is past the bound
  for (EmulatedGroup* g : {&copy, &none}) {
    const bool moved = g == &copy;
    std::vector<float> chunk = iota(big, 5.f), gathered(2 * big, -1.f), send = iota(2 * big, 0.f), recv(big, -1.f);
    g->all_gather(chunk.data(), gathered.data(), big, ElemType::F32)->wait();
    EXPECT_EQ(gathered[big], moved ? 5.f : -1.f);
    EXPECT_EQ(gathered[0], -1.f);
    g->reduce_scatter(send.data(), recv.data(), big, ElemType::F32, ReduceOp::Sum)->wait();
    EXPECT_EQ(recv[0], moved ? float(big) : -1.f);
    const size_t half = EmulatedGroup::kCountOnlyMovesBelow;  // bytes per peer
    std::vector<uint8_t> s8(2 * half, 7), r8(2 * half, 0);
    g->all_to_all_v(s8.data(), {half, half}, {0, half}, r8.data(), {half, half}, {0, half})->wait();
    EXPECT_EQ(r8[0], moved ? 7 : 0);
    // A small exchange (the expert counts) moves in both modes: the host plans the rows from it.
    std::vector<int32_t> c = {3, 4}, rc(2, 0);
    g->all_to_all_v(c.data(), {4, 4}, {0, 4}, rc.data(), {4, 4}, {0, 4})->wait();
    EXPECT_EQ(rc, c);
    // send / recv still carry their bytes (the pipeline boundary keeps realistic values).
    float out = 7.f, in = 0.f;
    g->send(&out, sizeof out, 0, 0)->wait();
    g->recv(&in, sizeof in, 0, 0)->wait();
    EXPECT_EQ(in, 7.f);
  }
  for (const char* op : {"all_gather", "reduce_scatter", "all_to_all_v", "send", "recv"})
    EXPECT_EQ(copy.stats().at(op).bytes, none.stats().at(op).bytes) << op;
  // Splits keep the payload mode.
  EmulatedGroup dp(0, 4, "dp", [](int, int key) { return std::make_pair(2, key / 2); },
                   EmulatedGroup::Payload::CountOnly);
  auto sub = dp.split(0, 0);
  std::vector<float> c(big, 1.f), g(2 * big, -1.f);
  sub->all_gather(c.data(), g.data(), big, ElemType::F32)->wait();
  EXPECT_EQ(g[0], -1.f);
}

TEST(EmulatedGroup, SendRecvLoopBackAtTheBoundarySize) {
  EmulatedGroup g(1, 3, "pp.act");  // a middle stage
  std::vector<float> x(4, 0.f), y = iota(4, 5.f);
  // Nothing sent yet: the neighbour's tensor is zeros of the boundary size.
  x.assign(4, 9.f);
  g.recv(x.data(), 16, 0, 0)->wait();
  EXPECT_EQ(x, std::vector<float>(4, 0.f));
  g.send(y.data(), 16, 2, 0)->wait();
  g.recv(x.data(), 16, 0, 1)->wait();  // the last sent tensor of that size
  EXPECT_EQ(x, y);
  std::vector<double> z(3, 1.0);
  g.send(z.data(), 24, 2, 1)->wait();  // another size: its own buffer
  g.recv(x.data(), 16, 0, 2)->wait();
  EXPECT_EQ(x, y);
  EXPECT_EQ(g.loopback_bytes(), 16 + 24);
  EXPECT_EQ(g.stats().at("send").calls, 2);
  EXPECT_EQ(g.stats().at("send").bytes, 40);
  EXPECT_EQ(g.stats().at("recv").bytes, 48);
  EXPECT_THROW(g.send(y.data(), 16, 1, 0), trex::Error) << "a send to itself";
  EXPECT_THROW(g.recv(x.data(), 16, 3, 0), trex::Error) << "a peer outside the group";
}

// With a receive source (the emulated rank's pipeline groups) recv gives a fixed random tensor of the message
// size whatever was sent: mean 0 and the requested standard deviation, not zeros and not the stage's own output.
TEST(EmulatedGroup, RecvSourceGivesAFixedRandomTensor) {
  EmulatedGroup g(1, 3, "pp.grad");
  g.set_recv_source(ElemType::F32, 0.5f, 11);
  const size_t n = 200000;
  std::vector<float> x(n, 9.f), y(n, 3.f);
  g.recv(x.data(), n * 4, 2, 0)->wait();
  double sum = 0, sq = 0;
  for (float v : x) sum += v, sq += double(v) * v;
  const double mean = sum / double(n), sd = std::sqrt(sq / double(n) - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sd, 0.5, 0.005);
  for (size_t i : {size_t(0), size_t(1), n - 1}) EXPECT_EQ(x[i], trex::comm::uniform_fill_value(11, i, 0.5f));
  g.send(y.data(), n * 4, 0, 0)->wait();  // to the sink: the next receive is the same tensor
  std::vector<float> x2(n, 0.f);
  g.recv(x2.data(), n * 4, 2, 1)->wait();
  EXPECT_EQ(x2, x);
  EXPECT_EQ(g.loopback_bytes(), int64_t(2 * n * 4));  // the source and the sink
  EXPECT_THROW(g.set_recv_source(ElemType::F32, 1.f, 1), trex::Error) << "after traffic";

  EmulatedGroup a(1, 2, "pp.act");
  a.set_recv_source(ElemType::BF16, 1.f, 5);
  std::vector<uint16_t> b(6, 0);
  a.recv(b.data(), 12, 0, 0)->wait();
  for (size_t i = 0; i < b.size(); ++i) {
    EXPECT_EQ(b[i], trex::comm::uniform_fill_bf16_bits(trex::comm::uniform_fill_value(5, i, 1.f)));
    EXPECT_NE(b[i] & 0x7fff, 0) << "element " << i << " is zero";
  }
  EXPECT_THROW(a.recv(b.data(), 11, 0, 1), trex::Error) << "not whole bf16 elements";
  EXPECT_THROW(EmulatedGroup(0, 2, "x").set_recv_source(ElemType::I32, 1.f, 1), trex::Error);
}

TEST(EmulatedGroup, SplitFollowsTheGivenRule) {
  EmulatedGroup plain(0, 2, "ep");
  EXPECT_THROW(plain.split(0, 0), trex::Error);
  EmulatedGroup dp(5, 8, "dp", [](int, int key) { return std::make_pair(4, key / 2); });
  auto sub = dp.split(1, 5);
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->size(), 4);
  EXPECT_EQ(sub->rank(), 2);
  EXPECT_EQ(sub->backend(), "emulated");
  EXPECT_EQ(dp.split(-1, 5), nullptr);
  EXPECT_THROW(EmulatedGroup(4, 4, "bad"), trex::Error);
}

}  // namespace
