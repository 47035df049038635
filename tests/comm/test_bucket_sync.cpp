// The bucket protocol (comm/bucket_sync.h) over a thread group with a host memory that records what it is
// asked: reductions start in the plan's start order on every rank whatever order the marks come in (so the
// collectives match and the sums are right), a bucket starts only once all of its marks are in, skipped
// buckets move nothing, finish() starts what never got its marks, gathers hand every rank every part, and a
// memory that moves another count than the plan says is refused with the bucket named.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "comm/bucket_sync.h"
#include "comm/rank_threads.h"
#include "comm/thread_group.h"

namespace {

using namespace trex;

// Bucket b's part on rank r holds r + 1 + 10 b + i at element i (the gradient), so the reduced part is known.
struct RecordingMemory final : comm::BucketMemory {
  int rank = 0, ranks = 1;
  std::vector<comm::SyncBucket> plan;
  std::vector<std::vector<float>> full, part;
  std::vector<int> reduced_order, done_order;
  int64_t count_skew = 0;  // added to the reduce-scatter's count (a memory that disagrees with its plan)

  RecordingMemory(int r, int n, std::vector<comm::SyncBucket> p) : rank(r), ranks(n), plan(std::move(p)) {
    for (const auto& b : plan) {
      full.emplace_back(size_t(b.part_elems * ranks), 0.0f);
      part.emplace_back(size_t(b.part_elems), 0.0f);
    }
  }
  comm::BucketTransfer reduce_args(int b, float scale) override {
    reduced_order.push_back(b);
    auto& f = full[size_t(b)];
    for (size_t i = 0; i < f.size(); ++i) f[i] = scale * float(rank + 1 + 10 * b + int(i));
    return {f.data(), part[size_t(b)].data(), size_t(plan[size_t(b)].part_elems + count_skew),
            comm::ElemType::F32};
  }
  void reduce_done(int b, comm::WorkPtr w) override {
    w->wait();
    done_order.push_back(b);
  }
  comm::BucketTransfer gather_args(int b) override {
    for (auto& x : part[size_t(b)]) x = float(100 * (rank + 1) + b);
    return {part[size_t(b)].data(), full[size_t(b)].data(), size_t(plan[size_t(b)].part_elems),
            comm::ElemType::F32};
  }
  void gather_done(int b, comm::WorkPtr w) override { w->wait(); }
};

float reduced(int b, int rank, int ranks, int64_t part,
              int64_t i) {  // the sum over ranks of element rank x part + i
  float s = 0;
  for (int q = 0; q < ranks; ++q) s += float(q + 1 + 10 * b + int(rank * part + i));
  return s;
}

TEST(BucketSync, ReductionsStartInPlanOrderWhateverTheMarksOrder) {
  constexpr int kRanks = 4;
  const std::vector<comm::SyncBucket> plan = {{3, 2}, {5, 1}, {0, 1}, {2, 3}};  // bucket 2 skipped
  const std::vector<int> order = {3, 1, 2, 0};
  auto world = comm::make_thread_group(kRanks, 30.0);
  std::vector<std::vector<int>> started(kRanks), done(kRanks);
  trex::testing::run_ranks(world, [&](int r) {
    RecordingMemory mem(r, kRanks, plan);
    comm::BucketSync sync(*world[size_t(r)], mem, plan, order);
    // Each rank marks in its own shuffled order (bucket b's marks: plan[b].marks of them).
    std::vector<int> marks;
    for (int b = 0; b < int(plan.size()); ++b)
      if (plan[size_t(b)].part_elems > 0)
        for (int k = 0; k < plan[size_t(b)].marks; ++k) marks.push_back(b);
    std::mt19937 rng(uint32_t(17 + r));
    std::shuffle(marks.begin(), marks.end(), rng);
    sync.begin(0.5f);
    std::vector<int> made(plan.size(), 0);
    for (int b : marks) {
      sync.mark_ready(b);
      ++made[size_t(b)];
      // A started bucket has all of its marks, and the started ones are a prefix of the start order.
      for (int s : mem.reduced_order) EXPECT_EQ(made[size_t(s)], plan[size_t(s)].marks) << "bucket " << s;
      const std::vector<int> prefix = {3, 1, 0};
      EXPECT_TRUE(std::equal(mem.reduced_order.begin(), mem.reduced_order.end(), prefix.begin()));
    }
    EXPECT_EQ(sync.buckets_started(), 3);  // every non-empty bucket got its marks
    sync.finish();
    started[size_t(r)] = mem.reduced_order, done[size_t(r)] = mem.done_order;
    for (int b : {0, 1, 3})
      for (int64_t i = 0; i < plan[size_t(b)].part_elems; ++i)
        EXPECT_FLOAT_EQ(mem.part[size_t(b)][size_t(i)],
                        0.5f * reduced(b, r, kRanks, plan[size_t(b)].part_elems, i))
            << "rank " << r << " bucket " << b << " element " << i;
    // Gathers: every part of every rank, the skipped bucket moving nothing.
    for (int b = 0; b < int(plan.size()); ++b) sync.start_gather(b);
    EXPECT_FALSE(sync.gathering(2));
    sync.wait_gathers();
    for (int b : {0, 1, 3})
      for (int q = 0; q < kRanks; ++q)
        for (int64_t i = 0; i < plan[size_t(b)].part_elems; ++i)
          EXPECT_EQ(mem.full[size_t(b)][size_t(q * plan[size_t(b)].part_elems + i)],
                    float(100 * (q + 1) + b));
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(started[size_t(r)], (std::vector<int>{3, 1, 0})) << "rank " << r;
    EXPECT_EQ(done[size_t(r)], (std::vector<int>{3, 1, 0})) << "rank " << r;
  }
}

TEST(BucketSync, StartsOnlyCompleteBucketsAndFinishStartsTheRest) {
  auto world = comm::make_thread_group(2, 30.0);
  trex::testing::run_ranks(world, [&](int r) {
    const std::vector<comm::SyncBucket> plan = {{4, 2}, {4, 1}};
    RecordingMemory mem(r, 2, plan);
    comm::BucketSync sync(*world[size_t(r)], mem, plan);
    sync.mark_ready(0);  // not armed: ignored
    sync.begin();
    sync.mark_ready(1);  // complete, but bucket 0 starts first
    EXPECT_EQ(sync.buckets_started(), 0);
    sync.mark_ready(0);
    EXPECT_EQ(sync.buckets_started(), 0);                // one of bucket 0's two marks
    EXPECT_THROW(sync.start_gather(0), std::exception);  // a gather inside an open sync
    sync.finish();                                       // the missing mark: started here, in order
    EXPECT_EQ(mem.reduced_order, (std::vector<int>{0, 1}));
    EXPECT_FALSE(sync.armed());
    sync.begin();
    sync.mark_ready(1);
    EXPECT_THROW(sync.mark_ready(1), std::exception);  // more marks than the plan's
    sync.finish();
  });
}

TEST(BucketSync, AMemoryMovingAnotherCountThanThePlanIsRefusedNamingTheBucket) {
  auto world = comm::make_thread_group(1, 30.0);
  RecordingMemory mem(0, 1, {{4, 1}});
  mem.count_skew = 1;
  comm::BucketSync sync(*world[0], mem, {{4, 1}});
  sync.begin();
  try {
    sync.mark_ready(0);
    FAIL() << "expected a refusal";
  } catch (const std::exception& e) {
    EXPECT_NE(
        std::string(e.what()).find("bucket 0's reduce-scatter moves 5 elements per rank, the plan says 4"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(comm::BucketSync(*world[0], mem, {{4, 1}, {2, 1}}, {1, 1}),
               std::exception);  // not a permutation
}

}  // namespace
