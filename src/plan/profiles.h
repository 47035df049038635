// Hardware profiles (configs/hardware/*.json) and implementation profiles (how efficiently one
// training implementation uses that hardware: calibrated from recorded measurements, or priors).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/model_math.h"

namespace trex::plan {

// One device (rank) and the fabric around it. Bandwidths are per device, per direction, achievable.
struct HardwareProfile {
  std::string name;    // profile id, e.g. "nvidia-h200"
  std::string device;  // human-readable
  double peak_bf16 = 0;  // dense FLOP/s per rank: the MFU denominator
  double peak_fp8 = 0;   // 0 = no FP8 matmul
  double hbm_gib = 0;
  double hbm_bw = 0;        // bytes/s
  double reserved_gib = 0;  // runtime, context, fragmentation: not usable by the trainer
  int64_t devices_per_node = 8;
  int64_t scaleup_domain = 8;  // ranks in one NVLink / UB domain
  double scaleup_bw = 0;
  double scaleout_bw = 0;
  double scaleup_latency = 0;  // seconds per collective hop
  double scaleout_latency = 0;
  double host_gib = 0;  // host memory available per rank (optimizer offload / swap)
  double host_bw = 0;   // host <-> device bytes/s per rank
  nlohmann::json source;  // the JSON it was read from, overrides applied
};

// `name_or_path`: a file, or a name under configs/hardware/ (trex::source_dir()).
// `overrides`: "key=value" pairs applied to the JSON before parsing (same keys as the file).
HardwareProfile load_hardware(const std::string& name_or_path, const std::vector<std::string>& overrides = {});
HardwareProfile parse_hardware(const nlohmann::json& j, const std::string& where);
std::vector<std::string> hardware_profile_names();

// How one implementation turns FLOPs, bytes and messages into time and memory.
struct ImplProfile {
  std::string name = "trex-prior";
  std::string note = "uncalibrated priors; T-Rex's own measurements are pending";
  bool calibrated = false;
  // Fractions of the hardware's peak / bandwidth achieved.
  double eff_dense = 0.55;   // dense GEMMs
  double eff_expert = 0.55;  // grouped expert GEMMs at many tokens per expert
  double expert_half_tokens = 128;  // tokens per expert at which the grouped GEMM reaches half of eff_expert
  double eff_attn = 0.35;           // core attention and indexer scoring
  double eff_hbm = 0.7;             // memory-bound kernels
  double eff_comm = 1.0;            // fraction of the profile's link bandwidth the collectives achieve
  double elementwise_factor = 4.0;  // HBM bytes moved by memory-bound kernels per byte of saved activation
  double block_overhead_s = 0;      // exposed launch/host time per block per micro-batch pass
  double step_overhead_s = 0;       // fixed per step (host, logging, sync)
  double dp_block_overhead_s = 0;   // exposed per block per pass with sharded data parallelism (FSDP
                                    // gather/free bookkeeping); only for ZeRO-3 with DP > 1
  // Rank emulation (`trex bench train --emulate-rank`, comm::EmulatedGroup): the cost of one device copy it issues
  // in place of a collective (one cudaMemcpyAsync per peer block of an all-to-all), on top of its bytes at HBM
  // speed; the prior is the order of one asynchronous copy's issue cost, fitted on the emulated records.
  double emulated_copy_s = 3e-6;
  AttnCompute attn_compute = AttnCompute::Sparse;
  // Memory.
  double weight_bytes = 2, grad_bytes = 4, master_bytes = 4, adam_bytes = 8, muon_bytes = 4;
  double act_scale = 1.0;            // multiplies the analytic saved-activation bytes
  double act_quadratic_bytes = 0;    // bytes per (head x query x key) per block for eager attention
  double logits_bytes = 4;           // bytes per (token x vocab entry) held on the last stage
  double fixed_gib = 1.0;            // allocator / workspace overhead counted in peak memory
  // Overlap: the fraction of each communication hidden behind compute when the layout enables it.
  double ep_overlap = 0.8, tp_overlap = 0.5, pp_overlap = 0.8, dp_overlap = 0.8, swap_overlap = 0.8;
  // Data parallelism the implementation uses without ZeRO-1 (hf_baseline uses FSDP = ZeRO-3).
  int default_zero = 1;
};

ImplProfile parse_impl(const nlohmann::json& j, const std::string& where);
nlohmann::json impl_to_json(const ImplProfile& p);
// A built-in name ("trex-prior", "hf_baseline-prior") or a JSON file.
ImplProfile load_impl(const std::string& name_or_path);

}  // namespace trex::plan
