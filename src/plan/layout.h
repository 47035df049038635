// A parallel layout (TP/PP/VPP/EP/ETP/CP/DP, micro-batch, recomputation, offload, ZeRO stage) and the
// workload it runs (sequence, global batch, CPT or SFT, optimizer, precision). check_layout() refuses
// impossible layouts with the reason.
#pragma once
#include <cstdint>
#include <string>

#include "plan/model_spec.h"
#include "plan/profiles.h"

namespace trex::plan {

enum class Recompute { None, Selective, Full };
enum class Offload { None, Swap };  // Swap: optimizer state lives on the host, streamed per step
enum class Optimizer { AdamW, Muon };
enum class Precision { BF16, FP8 };

struct Layout {
  int64_t tp = 1, pp = 1, vpp = 1, ep = 1, etp = 1, cp = 1, dp = 0;  // dp = 0: derived from the device count
  int64_t mbs = 1;
  // 0: replicated optimizer, 1: distributed optimizer (ZeRO-1), 2: gradients sharded too (ZeRO-2), 3: fully
  // sharded (FSDP)
  int zero = 1;
  Recompute recompute = Recompute::None;
  // With recompute Full: only main layers [0, rc_full_layers) replay their forward in full; the later layers (and
  // the MTP block) recompute selectively. -1: every layer in full. The trainer's recompute_full_layers.
  int64_t rc_full_layers = -1;
  Recompute recompute_at(int64_t layer) const {
    return recompute == Recompute::Full && rc_full_layers >= 0 && layer >= rc_full_layers ? Recompute::Selective
                                                                                          : recompute;
  }
  Offload offload = Offload::None;
  bool overlap = true;  // communication/compute overlap (EP A2A across micro-batches, TP, PP, DP)
};

struct Workload {
  int64_t seq = 4096;
  int64_t gbs = 1;  // sequences per step
  std::string mode = "sft";  // cpt | sft (sft freezes the router by default, as the T-Rex recipe does)
  Optimizer optimizer = Optimizer::AdamW;
  Precision precision = Precision::BF16;
  bool frozen_router = true;
  bool mtp = true;      // train the MTP block (counted in the FLOPs when on)
  double fill = 1.0;    // fraction of the sequence slots that are real tokens (SFT padding)
};

std::string to_string(const Layout& l);
std::string to_string(Recompute r);
std::string to_string(Offload o);
std::string to_string(Optimizer o);
// "TP2,PP8,VPP2,EP64,ETP1,CP1,DP32,MBS1,RC=full,RCL=20,OFF=swap,ZERO=1,OVL=1" (any subset, any order; RCL: the
// layers replayed in full under RC=full, Layout::rc_full_layers).
Layout parse_layout(const std::string& text);
Recompute parse_recompute(const std::string& s);
Optimizer parse_optimizer(const std::string& s);

// Number of micro-batches per step on each DP rank.
int64_t micro_batches(const Layout& l, const Workload& w);

// Fills layout.dp from the device count and returns "" when the layout can run; otherwise the reason.
std::string check_layout(const ModelSpec& m, const HardwareProfile& hw, const Workload& w, int64_t devices,
                         Layout& layout);

}  // namespace trex::plan
