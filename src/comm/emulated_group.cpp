// The emulated rank's communicator (emulated_group.h): local copies of the real byte counts.
#include "comm/emulated_group.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "comm/thread_group_device.h"
#include "core/error.h"

namespace trex::comm {

namespace {
class DoneWork final : public Work {
 public:
  bool test() override { return true; }
  void wait() override {}  // the copies were queued in order on the stream the compute uses
};
WorkPtr done() { return std::make_unique<DoneWork>(); }
}  // namespace

EmulatedGroup::EmulatedGroup(int rank, int size, std::string name, SplitRule split)
    : rank_(rank), size_(size), name_(std::move(name)), split_(std::move(split)) {
  TREX_CHECK(size >= 1 && rank >= 0 && rank < size, "emulated group '{}': rank {} of {} ranks", name_, rank, size);
}

EmulatedGroup::~EmulatedGroup() {
  for (auto& [key, l] : loops_) {
    if (l.device)
      tg::free_device(l.p);
    else
      std::free(l.p);
  }
}

void EmulatedGroup::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (tg::is_device_pointer(dst) || tg::is_device_pointer(src))
    tg::copy_async(dst, src, bytes, nullptr);
  else
    std::memmove(dst, src, bytes);
}

void EmulatedGroup::count(const char* op, size_t bytes) {
  EmulatedOpStats& s = stats_[op];
  ++s.calls;
  s.bytes += int64_t(bytes);
}

void EmulatedGroup::check_peer(int peer, const char* op) const {
  TREX_CHECK(peer >= 0 && peer < size_ && peer != rank_, "emulated group '{}' (rank {} of {}): {} with peer {}", name_,
             rank_, size_, op, peer);
}

EmulatedGroup::Loop& EmulatedGroup::loop(size_t bytes, bool device) {
  Loop& l = loops_[{bytes, device}];
  if (!l.p) {
    l.device = device;
    l.p = device ? tg::alloc_device_zeroed(bytes) : std::calloc(bytes, 1);
    TREX_CHECK(l.p, "emulated group '{}': no memory for a {} byte loop-back buffer", name_, bytes);
  }
  return l;
}

int64_t EmulatedGroup::loopback_bytes() const {
  int64_t n = 0;
  for (const auto& [key, l] : loops_) n += int64_t(key.first);
  return n;
}

WorkPtr EmulatedGroup::all_reduce(void*, size_t count_, ElemType t, ReduceOp) {
  count("all_reduce", count_ * elem_size(t));
  return done();
}

WorkPtr EmulatedGroup::all_gather(const void* send, void* recv, size_t n, ElemType t) {
  const size_t b = n * elem_size(t);
  count("all_gather", b);
  for (int r = 0; r < size_; ++r) copy(static_cast<char*>(recv) + size_t(r) * b, send, b);
  return done();
}

WorkPtr EmulatedGroup::reduce_scatter(const void* send, void* recv, size_t n, ElemType t, ReduceOp) {
  const size_t b = n * elem_size(t);
  count("reduce_scatter", b * size_t(size_));
  copy(recv, static_cast<const char*>(send) + size_t(rank_) * b, b);
  return done();
}

WorkPtr EmulatedGroup::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                                    const std::vector<size_t>& send_offsets, void* recv,
                                    const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets) {
  const size_t n = size_t(size_);
  TREX_CHECK(send_bytes.size() == n && send_offsets.size() == n && recv_bytes.size() == n && recv_offsets.size() == n,
             "emulated group '{}': all_to_all_v with {} / {} / {} / {} entries for {} ranks", name_, send_bytes.size(),
             send_offsets.size(), recv_bytes.size(), recv_offsets.size(), n);
  size_t out = 0;
  for (size_t p = 0; p < n; ++p) {
    if (int(p) != rank_) out += send_bytes[p];
    copy(static_cast<char*>(recv) + recv_offsets[p], static_cast<const char*>(send) + send_offsets[p],
         std::min(send_bytes[p], recv_bytes[p]));
  }
  count("all_to_all_v", out);
  return done();
}

WorkPtr EmulatedGroup::broadcast(void*, size_t bytes, int root) {
  TREX_CHECK(root >= 0 && root < size_, "emulated group '{}': broadcast from root {} of {}", name_, root, size_);
  count("broadcast", bytes);
  return done();
}

WorkPtr EmulatedGroup::send(const void* buf, size_t bytes, int peer, int) {
  check_peer(peer, "send");
  count("send", bytes);
  if (bytes > 0) copy(loop(bytes, tg::is_device_pointer(buf)).p, buf, bytes);
  return done();
}

WorkPtr EmulatedGroup::recv(void* buf, size_t bytes, int peer, int) {
  check_peer(peer, "recv");
  count("recv", bytes);
  if (bytes > 0) copy(buf, loop(bytes, tg::is_device_pointer(buf)).p, bytes);
  return done();
}

void EmulatedGroup::barrier() {}

std::unique_ptr<Communicator> EmulatedGroup::split(int color, int key) {
  TREX_CHECK(split_, "emulated group '{}' (rank {} of {}): split({}, {}) has no rule for the emulated rank's new "
             "group", name_, rank_, size_, color, key);
  if (color < 0) return nullptr;
  const auto [n, r] = split_(color, key);
  return std::make_unique<EmulatedGroup>(r, n, name_ + ".split");
}

}  // namespace trex::comm
