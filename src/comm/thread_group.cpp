// The thread-group communicator (thread_group.h): ranks are threads of one process sharing a Group; an operation
// is matched on the host and executed by the rank whose call completes it, on the host or on the group's CUDA
// stream (thread_group_device.h).
#include "comm/thread_group.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "comm/thread_group_device.h"
#include "core/error.h"

#ifndef TREX_HAVE_CUDA
namespace trex::comm::tg {  // a CPU build: every pointer is host memory, so nothing below is ever called
bool is_device_pointer(const void*) { return false; }
int current_device() { return 0; }
void* create_stream() { fail("thread-group communicator: device memory in a build without CUDA"); }
void destroy_stream(void*) {}
void* record_default_stream_event() { return create_stream(); }
void* record_event(void*) { return create_stream(); }
void destroy_event(void*) {}
bool event_done(void*) { return true; }
void stream_wait_event(void*, void*) {}
void copy_async(void*, const void*, size_t, void*) { create_stream(); }
void* alloc_device_zeroed(size_t) { return create_stream(); }
void free_device(void*) {}
void fill_uniform_async(void*, size_t, int, float, unsigned long long, void*) { create_stream(); }
void reduce_async(void*, const void* const*, int, size_t, int, int, void*) { create_stream(); }
}  // namespace trex::comm::tg
#endif

namespace trex::comm {

namespace {

using Clock = std::chrono::steady_clock;

enum class Kind { AllReduce, AllGather, ReduceScatter, AllToAllV, Broadcast, Barrier, Split, P2p };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::AllReduce: return "all_reduce";
    case Kind::AllGather: return "all_gather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllToAllV: return "all_to_all_v";
    case Kind::Broadcast: return "broadcast";
    case Kind::Barrier: return "barrier";
    case Kind::Split: return "split";
    case Kind::P2p: return "send/recv";
  }
  return "?";
}

// One rank's part of an operation.
struct Arrival {
  bool here = false;
  const void* send = nullptr;
  void* recv = nullptr;
  std::vector<size_t> send_bytes, send_off, recv_bytes, recv_off;  // all_to_all_v
  int color = 0, key = 0;                                          // split
  void* input_event = nullptr;  // device buffers: the caller's default-stream work before the call
  bool device = false;
};

struct Group;

// One operation (a collective of every rank, or a matched send / recv pair).
struct Op {
  Kind kind;
  std::string what;  // "all_reduce (4096 bytes)"
  size_t count = 0, bytes = 0;
  ElemType type = ElemType::U8;
  ReduceOp op = ReduceOp::Sum;
  int root = 0;
  std::vector<Arrival> arr;
  int arrived = 0;
  bool executed = false;
  std::string error;
  void* done_event = nullptr;  // device execution: recorded after the last copy / kernel
  std::vector<std::pair<std::shared_ptr<Group>, int>> split_out;  // per parent rank: its sub-group and rank there
  ~Op() {
    for (Arrival& a : arr) tg::destroy_event(a.input_event);
    tg::destroy_event(done_event);
  }
};

struct Group;

// Every group of one make_thread_group call (the world and all groups split from it): abort() marks them all
// failed, so a rank waiting in any of them (a pipeline recv, an expert exchange, a DP reduction) stops.
struct Job {
  std::mutex mu;
  std::vector<std::weak_ptr<Group>> groups;
};

struct Group {
  Group(int n, std::shared_ptr<Job> job, std::vector<int> world)
      : n(n), next_seq(size_t(n), 0), job(std::move(job)), world(std::move(world)) {}
  ~Group() {
    if (stream) tg::destroy_stream(stream);
  }
  const int n;
  std::mutex mu;
  std::condition_variable cv;
  std::string failed;  // non-empty: a rank timed out or the ranks disagreed; every later wait throws it
  std::vector<uint64_t> next_seq;
  std::map<uint64_t, std::shared_ptr<Op>> pending;
  // Point to point: posted, unmatched sends / recvs by (source, destination, tag), in posting order.
  std::map<std::tuple<int, int, int>, std::deque<std::shared_ptr<Op>>> sends, recvs;
  void* stream = nullptr;  // created by the first device operation
  std::shared_ptr<Job> job;
  std::vector<int> world;  // rank r of this group is rank world[r] of the job's first group
};

std::shared_ptr<Group> new_group(std::shared_ptr<Job> job, std::vector<int> world) {
  auto g = std::make_shared<Group>(int(world.size()), job, std::move(world));
  std::lock_guard<std::mutex> lock(job->mu);
  job->groups.push_back(g);
  return g;
}

bool any_device(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (tg::is_device_pointer(p)) return true;
  return false;
}

// ---- execution (the caller holds the group's lock) ----

template <typename T>
void host_reduce_typed(void* dst, const std::vector<const void*>& src, size_t count, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  for (size_t i = 0; i < count; ++i) {
    T acc = static_cast<const T*>(src[0])[i];
    for (size_t r = 1; r < src.size(); ++r) {
      const T v = static_cast<const T*>(src[r])[i];
      acc = op == ReduceOp::Sum ? T(acc + v) : op == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
    }
    d[i] = acc;
  }
}

float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even (NaN kept quiet)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void host_reduce(void* dst, const std::vector<const void*>& src, size_t count, ElemType t, ReduceOp op) {
  switch (t) {
    case ElemType::F32: return host_reduce_typed<float>(dst, src, count, op);
    case ElemType::F64: return host_reduce_typed<double>(dst, src, count, op);
    case ElemType::I32: return host_reduce_typed<int32_t>(dst, src, count, op);
    case ElemType::I64: return host_reduce_typed<int64_t>(dst, src, count, op);
    case ElemType::U8: return host_reduce_typed<uint8_t>(dst, src, count, op);
    case ElemType::BF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) {
        float acc = bf16_to_float(static_cast<const uint16_t*>(src[0])[i]);
        for (size_t r = 1; r < src.size(); ++r) {
          const float v = bf16_to_float(static_cast<const uint16_t*>(src[r])[i]);
          acc = op == ReduceOp::Sum ? acc + v : op == ReduceOp::Max ? std::max(acc, v) : std::min(acc, v);
        }
        d[i] = float_to_bf16(acc);
      }
      return;
    }
  }
}

// Copies and reductions of one operation, on the host or queued on the group's stream.
class Mover {
 public:
  Mover(Group& g, Op& op) : g_(g), op_(op) {
    for (const Arrival& a : op.arr) device_ = device_ || a.device;
    if (!device_) return;
    if (!g_.stream) g_.stream = tg::create_stream();
    for (const Arrival& a : op.arr)
      if (a.input_event) tg::stream_wait_event(g_.stream, a.input_event);
  }
  void copy(void* dst, const void* src, size_t bytes) {
    if (bytes == 0 || dst == src) return;
    if (device_)
      tg::copy_async(dst, src, bytes, g_.stream);
    else
      std::memmove(dst, src, bytes);
  }
  void reduce(void* dst, const std::vector<const void*>& src, size_t count, ElemType t, ReduceOp op) {
    if (!device_) return host_reduce(dst, src, count, t, op);
    bool all = tg::is_device_pointer(dst);
    for (const void* p : src) all = all && tg::is_device_pointer(p);
    TREX_CHECK(all, "thread-group {}: a reduction needs every rank's buffers in device memory or every rank's in "
               "host memory, not a mix", op_.what);
    tg::reduce_async(dst, src.data(), int(src.size()), count, int(t), int(op), g_.stream);
  }
  void finish() {
    if (device_) op_.done_event = tg::record_event(g_.stream);
  }

 private:
  Group& g_;
  Op& op_;
  bool device_ = false;
};

void execute(Group& g, Op& op) {
  const int n = g.n;
  Mover mv(g, op);
  const size_t es = elem_size(op.type);
  auto recv_at = [&](int r, size_t off) { return static_cast<char*>(op.arr[size_t(r)].recv) + off; };
  auto send_at = [&](int r, size_t off) { return static_cast<const char*>(op.arr[size_t(r)].send) + off; };
  switch (op.kind) {
    case Kind::AllReduce: {  // into rank 0's buffer in rank order, then to the others
      std::vector<const void*> src;
      for (int r = 0; r < n; ++r) src.push_back(op.arr[size_t(r)].recv);
      mv.reduce(op.arr[0].recv, src, op.count, op.type, op.op);
      for (int r = 1; r < n; ++r) mv.copy(op.arr[size_t(r)].recv, op.arr[0].recv, op.count * es);
      break;
    }
    case Kind::ReduceScatter:
      for (int b = 0; b < n; ++b) {
        std::vector<const void*> src;
        for (int r = 0; r < n; ++r) src.push_back(send_at(r, size_t(b) * op.count * es));
        mv.reduce(op.arr[size_t(b)].recv, src, op.count, op.type, op.op);
      }
      break;
    case Kind::AllGather:
      for (int r = 0; r < n; ++r)
        for (int q = 0; q < n; ++q) mv.copy(recv_at(r, size_t(q) * op.count * es), op.arr[size_t(q)].send, op.count * es);
      break;
    case Kind::Broadcast:
      for (int r = 0; r < n; ++r)
        if (r != op.root) mv.copy(op.arr[size_t(r)].recv, op.arr[size_t(op.root)].recv, op.bytes);
      break;
    case Kind::AllToAllV:
      for (int q = 0; q < n; ++q)
        for (int r = 0; r < n; ++r) {
          const Arrival &from = op.arr[size_t(q)], &to = op.arr[size_t(r)];
          TREX_CHECK(from.send_bytes[size_t(r)] == to.recv_bytes[size_t(q)],
                     "thread-group all_to_all_v: rank {} sends {} bytes to rank {}, which expects {} from it", q,
                     from.send_bytes[size_t(r)], r, to.recv_bytes[size_t(q)]);
          mv.copy(recv_at(r, to.recv_off[size_t(q)]), send_at(q, from.send_off[size_t(r)]), from.send_bytes[size_t(r)]);
        }
      break;
    case Kind::Split: {
      std::map<int, std::vector<std::pair<std::pair<int, int>, int>>> by_color;  // color -> ((key, rank), rank)
      for (int r = 0; r < n; ++r) {
        const Arrival& a = op.arr[size_t(r)];
        if (a.color >= 0) by_color[a.color].push_back({{a.key, r}, r});
      }
      op.split_out.assign(size_t(n), {nullptr, -1});
      for (auto& [color, members] : by_color) {
        std::sort(members.begin(), members.end());
        std::vector<int> world;
        for (const auto& m : members) world.push_back(g.world[size_t(m.second)]);
        auto sub = new_group(g.job, std::move(world));
        for (size_t i = 0; i < members.size(); ++i) op.split_out[size_t(members[i].second)] = {sub, int(i)};
      }
      break;
    }
    case Kind::P2p:  // arr[0] the sender, arr[1] the receiver
      mv.copy(op.arr[1].recv, op.arr[0].send, op.bytes);
      break;
    case Kind::Barrier:
      break;
  }
  mv.finish();
  op.executed = true;
}

// ---- completion ----

class ThreadWork final : public Work {
 public:
  ThreadWork(std::shared_ptr<Group> g, std::shared_ptr<Op> op, int rank, double timeout_s)
      : g_(std::move(g)), op_(std::move(op)), rank_(rank), timeout_s_(timeout_s) {}
  ~ThreadWork() override {
    if (waited_) return;
    try {  // the buffers must not be released while the operation may still write them (as MPI's requests)
      wait();
    } catch (...) {
    }
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (!op_->error.empty()) fail("{}", op_->error);
    if (!g_->failed.empty() && !op_->executed) fail("{}", g_->failed);
    return op_->executed && (!op_->done_event || tg::event_done(op_->done_event));
  }
  void wait() override {
    const Clock::time_point deadline = wait_queued();
    if (op_->done_event) {
      int spins = 0;
      while (!tg::event_done(op_->done_event)) {
        if (Clock::now() > deadline)
          fail("thread group rank {}: {} did not finish on the device within {:.1f} s", rank_, op_->what, timeout_s_);
        if (++spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    waited_ = true;
  }
  void stream_wait(void* stream) {
    wait_queued();
    if (op_->done_event) tg::stream_wait_event(stream, op_->done_event);
    waited_ = true;
  }

 private:
  // Blocks until every participant arrived and the operation ran (or was queued on the device).
  Clock::time_point wait_queued() {
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
    std::unique_lock<std::mutex> lock(g_->mu);
    const bool done = g_->cv.wait_until(lock, deadline, [&] {
      return op_->executed || !op_->error.empty() || !g_->failed.empty();
    });
    if (!op_->error.empty()) fail("{}", op_->error);
    if (op_->executed) return deadline;
    if (!g_->failed.empty()) fail("thread group rank {}: {} abandoned: {}", rank_, op_->what, g_->failed);
    if (!done) {
      std::string missing, present;
      const bool p2p = op_->kind == Kind::P2p;
      for (size_t r = 0; r < op_->arr.size(); ++r) {
        std::string& s = op_->arr[r].here ? present : missing;
        s += (s.empty() ? "" : ", ") + std::to_string(p2p ? peer_of(int(r)) : int(r));
      }
      g_->failed = fmt::format(
          "thread group rank {}: {} did not complete within {:.1f} s: {} {} never arrived (a rank died or hangs)",
          rank_, op_->what, timeout_s_, missing.find(',') == std::string::npos ? "rank" : "ranks", missing);
      g_->cv.notify_all();
      fail("{}", g_->failed);
    }
    return deadline;
  }
  int peer_of(int slot) const { return slot == 0 ? p2p_src : p2p_dst; }

 public:
  int p2p_src = -1, p2p_dst = -1;  // point to point: the ranks in arr[0] (sender) and arr[1] (receiver)

 private:
  std::shared_ptr<Group> g_;
  std::shared_ptr<Op> op_;
  int rank_;
  double timeout_s_;
  bool waited_ = false;
};

// ---- the communicator ----

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> g, int rank, double timeout_s) : g_(std::move(g)), rank_(rank) {
    timeout_s_ = timeout_s;
  }
  int rank() const override { return rank_; }
  int size() const override { return g_->n; }
  std::string backend() const override { return "threads"; }

  WorkPtr all_reduce(void* buf, size_t count, ElemType t, ReduceOp op) override {
    Arrival a;
    a.recv = buf, a.device = any_device({buf});
    return collective(Kind::AllReduce, count, count * elem_size(t), t, op, 0, std::move(a));
  }
  WorkPtr all_gather(const void* send, void* recv, size_t count, ElemType t) override {
    Arrival a;
    a.send = send, a.recv = recv, a.device = any_device({send, recv});
    return collective(Kind::AllGather, count, count * elem_size(t), t, ReduceOp::Sum, 0, std::move(a));
  }
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, ElemType t, ReduceOp op) override {
    Arrival a;
    a.send = send, a.recv = recv, a.device = any_device({send, recv});
    return collective(Kind::ReduceScatter, count, count * elem_size(t), t, op, 0, std::move(a));
  }
  WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_off,
                       void* recv, const std::vector<size_t>& recv_bytes,
                       const std::vector<size_t>& recv_off) override {
    const size_t n = size_t(g_->n);
    TREX_CHECK(send_bytes.size() == n && send_off.size() == n && recv_bytes.size() == n && recv_off.size() == n,
               "thread group rank {}: all_to_all_v: count/offset vectors must have one entry per rank ({})", rank_, n);
    Arrival a;
    a.send = send, a.recv = recv, a.device = any_device({send, recv});
    a.send_bytes = send_bytes, a.send_off = send_off, a.recv_bytes = recv_bytes, a.recv_off = recv_off;
    size_t total = 0;
    for (size_t b : send_bytes) total += b;
    return collective(Kind::AllToAllV, 0, total, ElemType::U8, ReduceOp::Sum, 0, std::move(a), false);
  }
  WorkPtr broadcast(void* buf, size_t bytes, int root) override {
    TREX_CHECK(root >= 0 && root < g_->n, "thread group rank {}: broadcast root {} not in [0, {})", rank_, root,
               g_->n);
    Arrival a;
    a.recv = buf, a.device = any_device({buf});
    return collective(Kind::Broadcast, bytes, bytes, ElemType::U8, ReduceOp::Sum, root, std::move(a));
  }
  WorkPtr send(const void* buf, size_t bytes, int peer, int tag) override {
    return p2p(true, buf, nullptr, bytes, peer, tag);
  }
  WorkPtr recv(void* buf, size_t bytes, int peer, int tag) override { return p2p(false, nullptr, buf, bytes, peer, tag); }
  void barrier() override {
    collective(Kind::Barrier, 0, 0, ElemType::U8, ReduceOp::Sum, 0, Arrival{})->wait();
  }
  // Marks every group of the job failed with "rank W failed: why" (W: this rank in the job's first group), waking
  // every waiting rank: their pending and later operations throw that message instead of waiting for this rank.
  void abort(const std::string& why) override {
    const std::string msg = fmt::format("rank {} failed: {}", g_->world[size_t(rank_)], why);
    std::vector<std::shared_ptr<Group>> groups;
    {
      std::lock_guard<std::mutex> lock(g_->job->mu);
      for (const auto& w : g_->job->groups)
        if (auto g = w.lock()) groups.push_back(std::move(g));
    }
    for (const auto& g : groups) {  // one lock at a time (split() takes a group's lock, then the job's)
      std::lock_guard<std::mutex> lock(g->mu);
      if (g->failed.empty()) g->failed = msg;
      g->cv.notify_all();
    }
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    Arrival a;
    a.color = color, a.key = key;
    std::shared_ptr<Op> op;
    collective(Kind::Split, 0, 0, ElemType::U8, ReduceOp::Sum, 0, std::move(a), true, &op)->wait();
    const auto& [sub, r] = op->split_out[size_t(rank_)];
    if (!sub) return nullptr;
    return std::make_unique<ThreadCommunicator>(sub, r, timeout_s_);
  }

 private:
  // The k-th collective of this rank joins the k-th of the others; the rank completing it executes it.
  WorkPtr collective(Kind kind, size_t count, size_t bytes, ElemType t, ReduceOp rop, int root, Arrival a,
                     bool same_bytes = true, std::shared_ptr<Op>* out = nullptr) {
    if (a.device) a.input_event = tg::record_default_stream_event();
    std::unique_lock<std::mutex> lock(g_->mu);
    TREX_CHECK(g_->failed.empty(), "thread group rank {}: {} after the group failed: {}", rank_, kind_name(kind),
               g_->failed);
    const uint64_t seq = g_->next_seq[size_t(rank_)]++;
    std::shared_ptr<Op>& slot = g_->pending[seq];
    if (!slot) {
      slot = std::make_shared<Op>();
      slot->kind = kind, slot->count = count, slot->bytes = bytes, slot->type = t, slot->op = rop, slot->root = root;
      slot->what = fmt::format("{} ({} bytes)", kind_name(kind), bytes);
      slot->arr.resize(size_t(g_->n));
    }
    std::shared_ptr<Op> op = slot;
    if (op->kind != kind || (same_bytes && op->bytes != bytes) || op->type != t || op->op != rop || op->root != root) {
      op->error = fmt::format("thread group: collective #{} disagrees: rank {} called {} ({} bytes, root {}), "
                              "another rank {} ({} bytes, root {})",
                              seq, rank_, kind_name(kind), bytes, root, kind_name(op->kind), op->bytes, op->root);
      g_->failed = op->error;
      g_->cv.notify_all();
      fail("{}", op->error);
    }
    a.here = true;
    op->arr[size_t(rank_)] = std::move(a);
    if (++op->arrived == g_->n) {
      g_->pending.erase(seq);
      run(*op);
    }
    if (out) *out = op;
    return std::make_unique<ThreadWork>(g_, op, rank_, timeout_s_);
  }

  WorkPtr p2p(bool is_send, const void* send, void* recv, size_t bytes, int peer, int tag) {
    TREX_CHECK(peer >= 0 && peer < g_->n && peer != rank_, "thread group rank {}: {} peer {} not in [0, {}) or itself",
               rank_, is_send ? "send" : "recv", peer, g_->n);
    const int src = is_send ? rank_ : peer, dst = is_send ? peer : rank_;
    Arrival a;
    a.send = send, a.recv = recv, a.device = any_device({is_send ? send : recv});
    if (a.device) a.input_event = tg::record_default_stream_event();
    a.here = true;
    std::unique_lock<std::mutex> lock(g_->mu);
    TREX_CHECK(g_->failed.empty(), "thread group rank {}: {} after the group failed: {}", rank_,
               is_send ? "send" : "recv", g_->failed);
    const auto key = std::make_tuple(src, dst, tag);
    auto& mine = is_send ? g_->sends[key] : g_->recvs[key];
    auto& theirs = is_send ? g_->recvs[key] : g_->sends[key];
    std::shared_ptr<Op> op;
    if (!theirs.empty()) {
      op = theirs.front();
      theirs.pop_front();
      if (op->bytes != bytes) {
        op->error = fmt::format("thread group: rank {} sends {} bytes to rank {} (tag {}), which receives {} bytes",
                                src, is_send ? bytes : op->bytes, dst, tag, is_send ? op->bytes : bytes);
        g_->cv.notify_all();
        fail("{}", op->error);
      }
      op->arr[is_send ? 0 : 1] = std::move(a);
      op->arrived = 2;
      run(*op);
    } else {
      op = std::make_shared<Op>();
      op->kind = Kind::P2p, op->bytes = bytes;
      op->what = is_send ? fmt::format("send to rank {} (tag {}, {} bytes)", peer, tag, bytes)
                         : fmt::format("recv from rank {} (tag {}, {} bytes)", peer, tag, bytes);
      op->arr.resize(2);
      op->arr[is_send ? 0 : 1] = std::move(a);
      op->arrived = 1;
      mine.push_back(op);
    }
    auto w = std::make_unique<ThreadWork>(g_, op, rank_, timeout_s_);
    w->p2p_src = src, w->p2p_dst = dst;
    return w;
  }

  void run(Op& op) {  // under the lock
    try {
      execute(*g_, op);
    } catch (const std::exception& e) {
      op.error = e.what();
    }
    g_->cv.notify_all();
    if (!op.error.empty()) fail("{}", op.error);
  }

  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_group(int n, double timeout_s) {
  TREX_CHECK(n >= 1, "make_thread_group: {} ranks (need at least 1)", n);
  std::vector<int> world(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) world[size_t(r)] = r;
  auto g = new_group(std::make_shared<Job>(), std::move(world));
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<ThreadCommunicator>(g, r, timeout_s));
  return out;
}

bool thread_group_stream_wait(Work& w, void* stream) {
  auto* t = dynamic_cast<ThreadWork*>(&w);
  if (!t) return false;
  t->stream_wait(stream);
  return true;
}

}  // namespace trex::comm
