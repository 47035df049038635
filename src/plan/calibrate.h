// Recorded measurements (docs/measurements/*.jsonl, one JSON record per line, appended by `trex bench`)
// and the fitter that derives an implementation profile's efficiencies from them.
//
// Record: {"id", "implementation", "hardware", "devices", "model" (preset | config path | inline config),
//          "layout" ("DP2,MBS1,ZERO=3" ...), "seq", "gbs", "mode", "optimizer", "precision", "mtp",
//          "measured": {"step_s", "tokens_per_s_per_device", "peak_gib"}, "source"}.
// One rank of a layout run alone (`trex bench train --emulate-rank`, collectives as local copies) adds
//          "emulated_rank": {"rank": R, "stage": S, "stage_layers": [layers of stage 0, 1, ...]}
// (the trainer's split, dsv4::split_layers): its step is predicted by Estimate::stage_alone[S] and its peak by
// stage_mem[S] with those stage layers, not by the whole layout's step (no bubble, no DP traffic on such a rank).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/estimate.h"

namespace trex::plan {

struct Measurement {
  std::string id, implementation, hardware, where;  // where: file:line
  int64_t devices = 1;
  ModelSpec model;
  Layout layout;
  Workload workload;
  double step_s = 0;
  double peak_gib = -1;  // < 0: not recorded
  // Rank emulation: >= 0 is the pipeline stage of the emulated rank, with the stage layers it ran.
  int64_t emulated_stage = -1;
  std::vector<int64_t> stage_layers;
  nlohmann::json raw;
  // Set by current_measurements() when step_s was carried over from older code (1 = as measured).
  double step_scale = 1;
  std::string note;  // why, e.g. "step x0.765 = <reference id> 0.2168 s now / 0.2834 s when measured"
};

Measurement parse_measurement(const nlohmann::json& j, const std::string& where);
std::vector<Measurement> load_measurements(const std::string& path);  // JSONL
// Validates `record` and appends it (the whole file is rewritten atomically).
void append_measurement(const std::string& path, const nlohmann::json& record);

// The records the planner calibrates with, out of everything recorded (`records` in recording order: file
// order, files by name; older records stay in the file as history):
//  1. Newest per id. The id names implementation, hardware, config, shape, devices and mesh, so a later
//     record with the same id is a re-measurement of the same run and supersedes the earlier ones.
//  2. Ratios carry over. A reference is a single-device, one-sequence record (devices 1, gbs 1). Any other
//     record whose reference (same implementation, hardware, model, seq, mode, optimizer, precision, mtp)
//     was re-measured after it has its step_s multiplied by (newest reference step / reference step at
//     the time of the record: the last one recorded before it): what such a run says about newer code is
//     its efficiency relative to one device, not its absolute rate. Peak memory is kept as measured. A
//     record with no earlier reference is used as measured.
std::vector<Measurement> current_measurements(const std::vector<Measurement>& records);

// What the planner predicts for a record under profile p: step seconds and peak GiB (the whole layout's, or the
// emulated rank's stage alone).
struct Prediction {
  double step_s = 0, peak_gib = 0;
};
Prediction predict_record(const Measurement& r, const ImplProfile& p);

struct PredictionCheck {
  std::string id, note;
  double measured_step = 0, predicted_step = 0, time_err = 0;  // relative error (pred - meas) / meas
  double measured_peak = -1, predicted_peak = 0, mem_err = 0;
};

// The prior profile an implementation's fit starts from ("hf_baseline" -> hf_baseline-prior, else trex).
ImplProfile prior_for(const std::string& implementation);
// Time parameters the fitter holds at prior_for()'s value because they were measured directly (none at present:
// with fewer records than time parameters a held parameter keeps the fit determined).
std::vector<std::string> held_parameters(const std::string& implementation);
std::vector<PredictionCheck> check_predictions(const std::vector<Measurement>& records, const ImplProfile& p);

struct Calibration {
  std::string implementation, hardware;
  ImplProfile profile;
  std::vector<std::string> fitted;  // names of the fitted parameters
  std::vector<PredictionCheck> checks;
  double max_time_err = 0, max_mem_err = 0;
};

// Fits the efficiencies of one implementation on one hardware profile to its records (all must share
// both). Time: eff_dense (= eff_expert), eff_attn, block_overhead_s, dp_block_overhead_s (when a record has DP > 1); memory:
// act_scale, act_quadratic_bytes (eager attention only), fixed_gib. Never more parameters than records; the
// held_parameters() of the implementation are not fitted.
Calibration calibrate(const std::vector<Measurement>& records, const ImplProfile& prior);
nlohmann::json calibration_to_json(const Calibration& c);

// Groups records by (implementation, hardware).
std::vector<std::vector<Measurement>> group_measurements(const std::vector<Measurement>& records);

}  // namespace trex::plan
