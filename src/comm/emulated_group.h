// One rank of a larger group, emulated on one device (`trex bench train --emulate-rank`): the communicator
// pretends to be rank R of an N-rank group and performs every operation as local copies of the real byte
// counts, so a rank's step runs with the data movement its buffers see (and its memory), without the other
// ranks. Per operation (what rank R would receive if every peer sent what R sends, i.e. perfectly balanced
// traffic):
//  - all_reduce: nothing moves (the buffer keeps R's own contribution);
//  - all_gather: R's chunk into R's block of recv only; the other blocks keep their values (in the ZeRO-1 weight
//    gather in place: the other ranks' slices as they started, so the emulated weights stay sane);
//  - reduce_scatter: R's own block of send copied to recv (no arithmetic: the sum of N equal contributions would
//    only scale it);
//  - all_to_all_v: block p of send (R's chunk for peer p) lands at recv block p, min(send, recv) bytes: R
//    "receives its own sent chunks" (balanced routing makes the sizes equal);
//  - broadcast, barrier: nothing;
//  - send: the bytes are copied into a loop-back buffer of that size (one per size, allocated on first use, zero
//    at first); recv: copied out of it. A pipeline stage thus receives its own last output / input gradient as
//    its neighbour's, at the boundary's size. With a receive source (set_recv_source; the emulated rank's
//    pipeline groups have one) recv instead copies a fixed deterministic random tensor of the message's size and
//    send copies into a sink: every stage computes on realistic values (a zero stream entering a stage makes every
//    RMS norm divide by sqrt(eps), the backward multiplies its gradient by 1 / sqrt(eps) per norm and overflows to
//    inf / NaN within a few layers; a last stage never receives a forward tensor, so it would see zeros only);
//  - split: a sub-group by a caller-given rule (the emulated mesh knows every rank's coordinates), else an error.
// Payload::CountOnly (`trex bench train --emulate-comm none`): all_gather, reduce_scatter and all_to_all_v of at
// least kCountOnlyMovesBelow bytes are counted but move nothing (the receive buffers keep what they held); smaller
// ones still move (the expert counts' exchange steers the host's row plan). The step time is then the rank's own
// compute: the
// local copies run on the compute's stream and would otherwise be charged to it (a real collective runs on its own
// stream and links). send / recv still copy (the pipeline boundary's random source keeps every stage's values sane).
// Host buffers are copied with memcpy, device buffers (any pointer on a device) with cudaMemcpyAsync on the legacy
// default stream, in order with the compute; Work completes at once. Every call is counted (calls, bytes this
// rank sends as the real collective would) in stats(): the CPU tests check those counts.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "comm/communicator.h"

namespace trex::comm {

struct EmulatedOpStats {
  int64_t calls = 0;
  int64_t bytes = 0;  // payload: all_reduce the buffer; all_gather the send chunk; reduce_scatter the whole send;
                      // all_to_all_v the bytes to peers other than R; send / recv the message; broadcast the buffer
};

class EmulatedGroup final : public Communicator {
 public:
  enum class Payload { Copy, CountOnly };
  static constexpr size_t kCountOnlyMovesBelow = size_t(64) << 10;
  // (color, key) of split -> (size, rank) of the new group on the emulated rank; empty: split is an error.
  using SplitRule = std::function<std::pair<int, int>(int color, int key)>;
  EmulatedGroup(int rank, int size, std::string name, SplitRule split = {}, Payload payload = Payload::Copy);
  ~EmulatedGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "emulated"; }

  WorkPtr all_reduce(void* buf, size_t count, ElemType t, ReduceOp op) override;
  WorkPtr all_gather(const void* send, void* recv, size_t count, ElemType t) override;
  WorkPtr reduce_scatter(const void* send, void* recv, size_t count, ElemType t, ReduceOp op) override;
  WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                       const std::vector<size_t>& send_offsets, void* recv, const std::vector<size_t>& recv_bytes,
                       const std::vector<size_t>& recv_offsets) override;
  WorkPtr broadcast(void* buf, size_t bytes, int root) override;
  WorkPtr send(const void* buf, size_t bytes, int peer, int tag) override;
  WorkPtr recv(void* buf, size_t bytes, int peer, int tag) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;

  // recv returns comm::uniform_fill_value(seed, i, std) (uniform_fill.h) as elements of `type` (F32 or BF16), a
  // fixed tensor per message size; send goes to a sink. Host buffers are filled on the host, device ones on the
  // device, with the same values.
  void set_recv_source(ElemType type, float std, uint64_t seed);

  // By operation name ("all_reduce", "all_gather", "reduce_scatter", "all_to_all_v", "broadcast", "send", "recv").
  const std::map<std::string, EmulatedOpStats>& stats() const { return stats_; }
  int64_t loopback_bytes() const;  // device / host memory held by the send / recv loop-back buffers
  const std::string& name() const { return name_; }

 private:
  void copy(void* dst, const void* src, size_t bytes);
  // copy() unless Payload::CountOnly and the operation's payload (`op_bytes`) is at least kCountOnlyMovesBelow.
  void copy_payload(void* dst, const void* src, size_t bytes, size_t op_bytes);
  void count(const char* op, size_t bytes);
  void check_peer(int peer, const char* op) const;
  struct Loop {
    void* p = nullptr;
    bool device = false;
  };
  // kind 0: the loop-back (or, with a receive source, the send sink); 1: the receive source's tensor.
  Loop& loop(size_t bytes, bool device, int kind = 0);
  struct Source {
    bool on = false;
    ElemType type = ElemType::F32;
    float std = 1.f;
    uint64_t seed = 0;
  } source_;

  int rank_, size_;
  std::string name_;
  SplitRule split_;
  Payload payload_;
  std::map<std::string, EmulatedOpStats> stats_;
  std::map<std::tuple<size_t, bool, int>, Loop> loops_;
};

}  // namespace trex::comm
