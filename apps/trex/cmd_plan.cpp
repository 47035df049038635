// `trex plan`: memory, step time and MFU of DeepSeek-V4 training layouts (src/plan), and
// `trex plan-calibrate`: fit an implementation profile to recorded measurements.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "plan/calibrate.h"
#include "plan/search.h"
#include "train/gpu_mesh_config.h"

namespace {

using namespace trex::plan;

struct PlanOptions {
  std::string model = "flash", hardware = "nvidia-h200", impl = "trex-prior", mode = "sft", optimizer = "adamw";
  std::string precision = "bf16", json_path, html_path;
  std::vector<std::string> layouts, hw_set;
  int64_t devices = 0, nodes = 0, seq = 4096, gbs = 0, top = 10;
  bool search = false, no_mtp = false, train_router = false;
  bool runnable = false;  // --search only among the layouts the GPU trainer runs (train::gpu_layout_gaps empty)
  std::string stage_layers;  // "11+11+11+10": the trainer's layers per stage instead of the balanced split
  int64_t stage = -1;        // the stage whose rank's communication is printed (-1: every stage)
  double fill = 1.0;
};

void run_plan(const PlanOptions& o) {
  HardwareProfile hw = load_hardware(o.hardware, o.hw_set);
  int64_t devices = o.devices > 0 ? o.devices : o.nodes * hw.devices_per_node;
  TREX_CHECK(devices > 0, "give --devices N or --nodes N");
  TREX_CHECK(o.gbs > 0, "give --gbs (sequences per step)");
  Workload w;
  w.seq = o.seq, w.gbs = o.gbs, w.mode = o.mode, w.optimizer = parse_optimizer(o.optimizer);
  TREX_CHECK(o.mode == "cpt" || o.mode == "sft", "--mode must be cpt or sft");
  TREX_CHECK(o.precision == "bf16" || o.precision == "fp8", "--precision must be bf16 or fp8");
  w.precision = o.precision == "fp8" ? Precision::FP8 : Precision::BF16;
  w.frozen_router = o.mode == "sft" && !o.train_router;
  w.mtp = !o.no_mtp;
  w.fill = o.fill;
  ModelSpec model = load_model_spec(o.model);
  ImplProfile impl = load_impl(o.impl);
  Estimator est(model, hw, impl, w);
  const ParamCounts pc = est.math().params();
  std::printf("model %s: %.2fB parameters (+%.2fB MTP), %.2fB activated; %.1f GFLOP/token (project convention, "
              "seq %ld%s), %.1f (6N)\n",
              model.name.c_str(), pc.main_total / 1e9, pc.mtp / 1e9, pc.activated / 1e9,
              est.math().train_flops_per_token(w.mtp && model.n_mtp > 0) / 1e9, long(w.seq),
              w.mtp && model.n_mtp > 0 ? ", MTP on" : "", est.math().six_n_flops_per_token() / 1e9);
  std::printf("hardware %s x %ld (%.1f BF16 TFLOP/s, %.1f GiB usable each); implementation %s (%s)\n",
              hw.name.c_str(), long(devices), hw.peak_bf16 / 1e12, hw.hbm_gib - hw.reserved_gib, impl.name.c_str(),
              impl.note.c_str());
  std::printf("workload: %s, seq %ld, global batch %ld sequences, %s, %s%s\n\n", w.mode.c_str(), long(w.seq),
              long(w.gbs), to_string(w.optimizer).c_str(), o.precision.c_str(),
              w.frozen_router ? ", router frozen" : "");
  std::vector<Estimate> rows;
  for (const auto& text : o.layouts) {
    Layout l = parse_layout(text);
    if (!o.stage_layers.empty()) {  // the trainer's stage layers (dsv4::split_layers), as an emulated rank runs
      TREX_CHECK(l.vpp == 1, "--stage-layers takes one chunk per stage (layout {} has VPP{})", text, l.vpp);
      std::vector<std::vector<int64_t>> chunks;
      int64_t next = 0;
      for (size_t at = 0; at <= o.stage_layers.size();) {
        const size_t plus = std::min(o.stage_layers.find('+', at), o.stage_layers.size());
        const int64_t n = std::stoll(o.stage_layers.substr(at, plus - at));
        TREX_CHECK(n >= 1, "--stage-layers {}: a stage of {} layers", o.stage_layers, n);
        chunks.emplace_back();
        for (int64_t k = 0; k < n; ++k) chunks.back().push_back(next++);
        at = plus + 1;
      }
      if (w.mtp && model.n_mtp > 0 && !chunks.empty()) chunks.back().push_back(next++);  // the MTP block last
      TREX_CHECK(int64_t(chunks.size()) == l.pp, "--stage-layers {} gives {} stages for layout {} (PP{})",
                 o.stage_layers, chunks.size(), text, l.pp);
      est.set_partition(l.pp, 1, chunks);
    }
    if (l.zero == 1 && impl.default_zero != 1 && text.find("ZERO") == std::string::npos) l.zero = impl.default_zero;
    rows.push_back(est.estimate(l, devices));
  }
  nlohmann::json out = {{"model", model.name},       {"hardware", hw.name},  {"devices", devices},
                        {"implementation", impl_to_json(impl)}, {"seq", w.seq}, {"gbs", w.gbs},
                        {"mode", w.mode},            {"optimizer", to_string(w.optimizer)},
                        {"flops_per_token", est.math().train_flops_per_token(w.mtp && model.n_mtp > 0)},
                        {"six_n_flops_per_token", est.math().six_n_flops_per_token()}};
  if (!rows.empty()) {
    std::printf("%s\n", estimates_table(rows).c_str());
    for (const auto& e : rows)
      if (e.valid)
        std::printf("%s: memory on stage %ld: weights %.1f, grads %.1f, optimizer %.1f, activations %.1f (%.1f "
                    "micro-batches in flight), logits %.1f, buffers %.1f, workspace %.1f, swap %.1f, fixed %.1f GiB; exposed comm "
                    "TP %.2f EP %.2f PP %.2f DP %.2f s; blocks per stage %s\n",
                    to_string(e.layout).c_str(), long(e.mem.stage), e.mem.weights, e.mem.grads, e.mem.optimizer,
                    e.mem.activations, e.mem.inflight, e.mem.logits, e.mem.comm_buffers, e.mem.workspace, e.mem.swap_buffers,
                    e.mem.fixed, e.time.tp + e.time.cp, e.time.ep, e.time.pp, e.time.dp,
                    nlohmann::json(e.stage_blocks).dump().c_str());
    // Communication per step by kind (comm_volume.h), per stage, for both targets.
    std::printf("\ncommunication per step of one rank, by kind (GiB / calls as `trex bench train --emulate-rank` "
                "counts them); seconds: 'emu' = the emulated rank (`--emulate-comm copy`: local device copies on the "
                "compute stream, fully exposed, %.2f TB/s HBM x %.2f, read + write, %.1f us per copy issued), 'none' "
                "= `--emulate-comm none`, 'links' = the real cluster's ring collectives (NVLink %.0f GB/s inside "
                "%ld ranks, scale-out %.0f GB/s beyond, %.0f / %.0f us per hop; before overlap: the step hides "
                "%.0f%% of DP, %.0f%% of EP, %.0f%% of PP, %.0f%% of TP traffic)\n",
                hw.hbm_bw / 1e12, impl.eff_hbm, impl.emulated_copy_s * 1e6, hw.scaleup_bw / 1e9,
                long(hw.scaleup_domain), hw.scaleout_bw / 1e9, hw.scaleup_latency * 1e6, hw.scaleout_latency * 1e6,
                100 * impl.dp_overlap, 100 * impl.ep_overlap, 100 * impl.pp_overlap, 100 * impl.tp_overlap);
    for (const auto& e : rows) {
      if (!e.valid) continue;
      for (size_t s = 0; s < e.stage_comm.size(); ++s) {
        if (o.stage >= 0 && int64_t(s) != o.stage) continue;
        std::printf("  %s, stage %zu (%zu blocks, %ld micro-batches):\n%s", to_string(e.layout).c_str(), s,
                    size_t(e.stage_blocks[s]), long(e.micro_batches), comm_table(e.stage_comm[s]).c_str());
        std::printf("    predicted step of this stage's rank, emulated (`trex bench train --emulate-rank`, stage "
                    "alone): %.3f s with copies, %.3f s with --emulate-comm none (of which optimizer %.3f)\n",
                    e.stage_alone[s], e.stage_alone_none[s], e.stage_optimizer[s]);
      }
      std::printf("    predicted step of the layout on the cluster: %.3f s (exposed DP %.3f, EP %.3f, PP %.3f, TP %.3f, "
                  "bubble %.3f)\n",
                  e.time.step, e.time.dp, e.time.ep, e.time.pp, e.time.tp + e.time.cp, e.time.bubble);
    }
    out["layouts"] = nlohmann::json::array();
    for (const auto& e : rows) {
      out["layouts"].push_back(estimate_to_json(e));
      if (!e.valid) continue;
      auto& j = out["layouts"].back();
      j["stage_alone_s"] = e.stage_alone;  // the emulated rank of each stage (--emulate-comm copy)
      j["stage_alone_none_s"] = e.stage_alone_none;
      j["stage_comm"] = nlohmann::json::array();
      for (const auto& c : e.stage_comm) j["stage_comm"].push_back(comm_to_json(c));
    }
  }
  // What the trainer runs today, beside the prediction (the planner also models layouts it does not run yet).
  auto gaps = [&](const Layout& l) {
    trex::train::GpuLayoutAsk a;
    a.tp = l.tp, a.pp = l.pp, a.vpp = l.vpp, a.ep = l.ep, a.etp = l.etp, a.cp = l.cp, a.dp = l.dp;
    a.recompute = l.recompute != trex::plan::Recompute::None;
    a.optimizer_offload = l.offload != trex::plan::Offload::None;
    a.fully_sharded = l.zero == 3;
    a.zero = l.zero;
    a.muon = w.optimizer == trex::plan::Optimizer::Muon;
    a.freeze = w.frozen_router;
    return trex::train::gpu_layout_gaps(a);
  };
  auto print_gaps = [&](const std::vector<Estimate>& es) {
    for (const auto& e : es) {
      const std::string g = gaps(e.layout);
      std::printf("  %-48s trex train --device cuda: %s\n", to_string(e.layout).c_str(),
                  g.empty() ? "runs today" : ("not yet: " + g).c_str());
    }
  };
  if (!rows.empty()) {
    print_gaps(rows);
    for (size_t i = 0; i < rows.size(); ++i) out["layouts"][i]["trex_train_missing"] = gaps(rows[i].layout);
  }
  std::vector<Estimate> best;
  if (o.search) {
    std::function<bool(const Layout&)> accept;
    if (o.runnable)
      accept = [&](Layout l) {  // the search's candidates leave dp to the estimate: the ranks left over
        if (l.dp <= 0) l.dp = devices / (l.tp * l.pp * l.cp);
        return gaps(l).empty();
      };
    SearchResult res = search_layouts(est, devices, size_t(o.top), true, accept);
    std::printf("\nsearch%s: %ld layouts considered, %ld refused, %ld out of memory; best %zu:\n%s",
                o.runnable ? " (only layouts trex train --device cuda runs today)" : "",
                long(res.considered), long(res.refused), long(res.out_of_memory), res.best.size(),
                estimates_table(res.best).c_str());
    out["search"] = {{"considered", res.considered}, {"refused", res.refused}, {"out_of_memory", res.out_of_memory}};
    out["best"] = nlohmann::json::array();
    for (const auto& e : res.best) {
      out["best"].push_back(estimate_to_json(e));
      out["best"].back()["trex_train_missing"] = gaps(e.layout);
    }
    best = res.best;
    print_gaps(best);
  }
  if (!o.json_path.empty()) trex::write_json_atomic(o.json_path, out, 1);
  if (!o.html_path.empty()) {
    std::vector<Estimate> all = rows;
    all.insert(all.end(), best.begin(), best.end());
    trex::write_text_atomic(o.html_path, estimates_html(all, fmt::format("trex plan: {} on {} x {}", model.name, devices,
                                                                         hw.name)));
  }
}

const bool registered_plan = trex::cli::register_command(
    {"plan", "predict memory, step time and MFU of DeepSeek-V4 training layouts; search for the best",
     [](CLI::App& app) {
       auto o = std::make_shared<PlanOptions>();
       app.add_option("--model", o->model, "flash, pro, or a config.json (either dialect)")->capture_default_str();
       app.add_option("--hardware", o->hardware, "a profile under configs/hardware or a JSON file")
           ->capture_default_str();
       app.add_option("--hw-set", o->hw_set, "override a hardware profile key: key=value (repeatable)");
       app.add_option("--impl", o->impl, "implementation profile: trex-prior, hf_baseline-prior or a JSON file "
                                         "(a calibration written by plan-calibrate)")
           ->capture_default_str();
       app.add_option("--devices", o->devices, "ranks (GPUs / NPU dies)");
       app.add_option("--nodes", o->nodes, "nodes (x devices_per_node of the profile)");
       app.add_option("--seq", o->seq, "sequence length")->capture_default_str();
       app.add_option("--gbs", o->gbs, "global batch in sequences");
       app.add_option("--mode", o->mode, "cpt or sft (sft freezes the router)")->capture_default_str();
       app.add_option("--optimizer", o->optimizer, "adamw or muon")->capture_default_str();
       app.add_option("--precision", o->precision, "bf16 or fp8 matmuls")->capture_default_str();
       app.add_flag("--no-mtp", o->no_mtp, "do not train the MTP block");
       app.add_flag("--train-router", o->train_router, "train the router in SFT too");
       app.add_option("--fill", o->fill, "fraction of sequence slots holding real tokens")->capture_default_str();
       app.add_option("--layout", o->layouts, "e.g. TP2,PP8,VPP2,EP64,MBS1,RC=full,OFF=swap (repeatable)");
       app.add_flag("--search", o->search, "enumerate layouts and print the best");
       app.add_option("--top", o->top, "layouts kept by --search")->capture_default_str();
       app.add_flag("--runnable", o->runnable, "--search only among the layouts trex train --device cuda runs today");
       app.add_option("--stage-layers", o->stage_layers,
                      "layers per pipeline stage, e.g. 11+11+11+10 (the trainer's split, as `trex bench train "
                      "--emulate-rank` prints it) instead of the planner's balanced split");
       app.add_option("--stage", o->stage, "print the communication of this stage's rank only (default: every stage)");
       app.add_option("--json", o->json_path, "write the results as JSON");
       app.add_option("--html", o->html_path, "write an HTML page with charts");
       app.callback([o] { run_plan(*o); });
     }});

const bool registered_calibrate = trex::cli::register_command(
    {"plan-calibrate", "fit implementation profiles to recorded measurements and check every prediction",
     [](CLI::App& app) {
       auto path = std::make_shared<std::string>((trex::source_dir() / "docs/measurements/measurements.jsonl").string());
       auto out_dir = std::make_shared<std::string>();
       auto loo = std::make_shared<bool>(false);
       app.add_option("--measurements", *path, "JSONL of recorded runs")->capture_default_str();
       app.add_option("--write", *out_dir, "directory for calibration-<impl>-<hardware>.json files");
       app.add_flag("--leave-one-out", *loo, "also predict each record from a fit to the others");
       app.callback([path, out_dir, loo] {
         auto records = current_measurements(load_measurements(*path));  // newest per id, see calibrate.h
         int bad = 0;
         for (const auto& group : group_measurements(records)) {
           Calibration cal = calibrate(group, prior_for(group[0].implementation));
           std::printf("%s on %s: %zu records, fitted %s\n", cal.implementation.c_str(), cal.hardware.c_str(),
                       group.size(), nlohmann::json(cal.fitted).dump().c_str());
           std::printf("  eff_dense %.3f eff_attn %.3f block_overhead %.4f s dp_block_overhead %.4f s emulated_copy "
                       "%.2f us act_scale %.2f act_quadratic %.2f B fixed %.2f GiB\n",
                       cal.profile.eff_dense, cal.profile.eff_attn, cal.profile.block_overhead_s,
                       cal.profile.dp_block_overhead_s, cal.profile.emulated_copy_s * 1e6, cal.profile.act_scale,
                       cal.profile.act_quadratic_bytes, cal.profile.fixed_gib);
           for (const auto& c : cal.checks) {
             std::printf("  %-48s step %.3f s, predicted %.3f (%+.1f%%); peak %.1f GiB, predicted %.1f (%+.1f%%)%s%s\n",
                         c.id.c_str(), c.measured_step, c.predicted_step, 100 * c.time_err, c.measured_peak,
                         c.predicted_peak, 100 * c.mem_err, c.note.empty() ? "" : "\n      ", c.note.c_str());
             bad += std::fabs(c.time_err) > 0.15 || (c.measured_peak > 0 && std::fabs(c.mem_err) > 0.10);
           }
           if (*loo && group.size() > 1) {
             std::printf("  leave-one-out (fit to the other records):\n");
             for (size_t i = 0; i < group.size(); ++i) {
               std::vector<Measurement> rest;
               for (size_t k = 0; k < group.size(); ++k)
                 if (k != i) rest.push_back(group[k]);
               Calibration c2 = calibrate(rest, prior_for(group[0].implementation));
               auto chk = check_predictions({group[i]}, c2.profile)[0];
               std::printf("  %-48s step %+.1f%%, peak %+.1f%%\n", chk.id.c_str(), 100 * chk.time_err,
                           100 * chk.mem_err);
             }
           }
           if (!out_dir->empty()) {
             auto file = trex::fs::path(*out_dir) / fmt::format("calibration-{}-{}.json", cal.implementation, cal.hardware);
             trex::write_json_atomic(file, calibration_to_json(cal), 1);
             std::printf("  wrote %s\n", file.string().c_str());
           }
         }
         if (bad) trex::cli::exit_with(2);
       });
     }});

}  // namespace
