// The emulated rank's communicator (emulated_group.h): local copies of the real byte counts.
#include "comm/emulated_group.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "comm/thread_group_device.h"
#include "comm/uniform_fill.h"
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

EmulatedGroup::EmulatedGroup(int rank, int size, std::string name, SplitRule split, Payload payload)
    : rank_(rank), size_(size), name_(std::move(name)), split_(std::move(split)), payload_(payload) {
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

void EmulatedGroup::copy_payload(void* dst, const void* src, size_t bytes, size_t op_bytes) {
  if (payload_ == Payload::Copy || op_bytes < kCountOnlyMovesBelow) copy(dst, src, bytes);
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

EmulatedGroup::Loop& EmulatedGroup::loop(size_t bytes, bool device, int kind) {
  Loop& l = loops_[{bytes, device, kind}];
  if (!l.p) {
    l.device = device;
    l.p = device ? tg::alloc_device_zeroed(bytes) : std::calloc(bytes, 1);
    TREX_CHECK(l.p, "emulated group '{}': no memory for a {} byte loop-back buffer", name_, bytes);
    if (kind == 1) {  // the receive source's tensor
      const size_t es = elem_size(source_.type);
      TREX_CHECK(bytes % es == 0, "emulated group '{}': a {} byte message is not a whole number of {} byte elements "
                 "(the receive source's type)", name_, bytes, es);
      const size_t n = bytes / es;
      if (device) {
        tg::fill_uniform_async(l.p, n, int(source_.type), source_.std, source_.seed, nullptr);
      } else if (source_.type == ElemType::BF16) {
        auto* q = static_cast<uint16_t*>(l.p);
        for (size_t i = 0; i < n; ++i) q[i] = uniform_fill_bf16_bits(uniform_fill_value(source_.seed, i, source_.std));
      } else {
        auto* q = static_cast<float*>(l.p);
        for (size_t i = 0; i < n; ++i) q[i] = uniform_fill_value(source_.seed, i, source_.std);
      }
    }
  }
  return l;
}

void EmulatedGroup::set_recv_source(ElemType type, float std, uint64_t seed) {
  TREX_CHECK(type == ElemType::F32 || type == ElemType::BF16,
             "emulated group '{}': the receive source is F32 or BF16, got element type {}", name_, int(type));
  TREX_CHECK(loops_.empty(), "emulated group '{}': set the receive source before the first send / recv", name_);
  source_ = Source{true, type, std, seed};
}

int64_t EmulatedGroup::loopback_bytes() const {
  int64_t n = 0;
  for (const auto& [key, l] : loops_) n += int64_t(std::get<0>(key));
  return n;
}

WorkPtr EmulatedGroup::all_reduce(void*, size_t count_, ElemType t, ReduceOp) {
  count("all_reduce", count_ * elem_size(t));
  return done();
}

WorkPtr EmulatedGroup::all_gather(const void* send, void* recv, size_t n, ElemType t) {
  const size_t b = n * elem_size(t);
  count("all_gather", b);
  // Only R's own block: the other blocks keep what they hold (the peers' values as of their last gather: for the
  // ZeRO-1 weight gather in place, the weights the other ranks' slices started with), so the emulated model keeps
  // sane weights instead of R's slice copied over every other slice.
  copy_payload(static_cast<char*>(recv) + size_t(rank_) * b, send, b, b * size_t(size_));
  return done();
}

WorkPtr EmulatedGroup::reduce_scatter(const void* send, void* recv, size_t n, ElemType t, ReduceOp) {
  const size_t b = n * elem_size(t);
  count("reduce_scatter", b * size_t(size_));
  copy_payload(recv, static_cast<const char*>(send) + size_t(rank_) * b, b, b * size_t(size_));
  return done();
}

WorkPtr EmulatedGroup::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                                    const std::vector<size_t>& send_offsets, void* recv,
                                    const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_offsets) {
  const size_t n = size_t(size_);
  TREX_CHECK(send_bytes.size() == n && send_offsets.size() == n && recv_bytes.size() == n && recv_offsets.size() == n,
             "emulated group '{}': all_to_all_v with {} / {} / {} / {} entries for {} ranks", name_, send_bytes.size(),
             send_offsets.size(), recv_bytes.size(), recv_offsets.size(), n);
  size_t out = 0, total = 0;
  for (size_t p = 0; p < n; ++p) {
    if (int(p) != rank_) out += send_bytes[p];
    total += send_bytes[p];
  }
  // Peer blocks that follow each other on both sides move as one copy: an expert exchange's blocks are contiguous,
  // and one copy per peer (128 at ep=128) would cost the host far more than the one collective it stands for.
  size_t run_send = 0, run_recv = 0, run_bytes = 0;
  for (size_t p = 0; p < n; ++p) {
    const size_t b = std::min(send_bytes[p], recv_bytes[p]);
    if (run_bytes > 0 && send_offsets[p] == run_send + run_bytes && recv_offsets[p] == run_recv + run_bytes) {
      run_bytes += b;
      continue;
    }
    copy_payload(static_cast<char*>(recv) + run_recv, static_cast<const char*>(send) + run_send, run_bytes, total);
    run_send = send_offsets[p], run_recv = recv_offsets[p], run_bytes = b;
  }
  copy_payload(static_cast<char*>(recv) + run_recv, static_cast<const char*>(send) + run_send, run_bytes, total);
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
  if (bytes > 0) copy(buf, loop(bytes, tg::is_device_pointer(buf), source_.on ? 1 : 0).p, bytes);
  return done();
}

void EmulatedGroup::barrier() {}

std::unique_ptr<Communicator> EmulatedGroup::split(int color, int key) {
  TREX_CHECK(split_, "emulated group '{}' (rank {} of {}): split({}, {}) has no rule for the emulated rank's new "
             "group", name_, rank_, size_, color, key);
  if (color < 0) return nullptr;
  const auto [n, r] = split_(color, key);
  return std::make_unique<EmulatedGroup>(r, n, name_ + ".split", SplitRule{}, payload_);
}

}  // namespace trex::comm
