// trex parity: runs the CPU DeepSeek-V4 model forward and backward on a golden fixture (made by
// make_fixture.py with Hugging Face transformers) and compares logits, loss, every hidden state, the CSA
// indexer selections and every gradient. Prints one JSON object; exits 1 when a tolerance is exceeded
// (fixture README: logits/hidden max|d|/max|ref| < 1e-4, loss |d| < 1e-5, each grad ||d||/||ref|| < 1e-3).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include "ckpt/safetensors.h"
#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/config.h"
#include "model/dsv4/model.h"
#include "model/dsv4/naming.h"

extern "C" void openblas_set_num_threads(int);

namespace trex::cli {
namespace {

using dsv4::Model;

struct ParityArgs {
  std::string model_dir, io_file, grads_file, device = "cpu";
  int threads = 0;
  double tol_act = 1e-4, tol_loss = 1e-5, tol_grad = 1e-3;
};

std::vector<float> to_f32(const TensorView& v, const std::string& what) {
  std::vector<float> out(size_t(v.numel()));
  if (v.dtype == DType::I64 || v.dtype == DType::I32) fail("{}: expected a float tensor, got {}", what,
                                                           dtype_name(v.dtype));
  convert_to_f32(v.dtype, v.data, out.data(), out.size());
  return out;
}

std::vector<int32_t> to_i32(const TensorView& v, const std::string& what) {
  std::vector<int32_t> out(size_t(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (v.dtype == DType::I64)
      out[i] = int32_t(v.as<int64_t>()[i]);
    else if (v.dtype == DType::I32)
      out[i] = v.as<int32_t>()[i];
    else
      fail("{}: expected an integer tensor, got {}", what, dtype_name(v.dtype));
  }
  return out;
}

// max |a - ref| / max |ref|
double max_rel(const float* a, const float* ref, size_t n) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; ++i) {
    md = std::max(md, std::fabs(double(a[i]) - double(ref[i])));
    mr = std::max(mr, std::fabs(double(ref[i])));
  }
  return mr > 0 ? md / mr : md;
}

// ||a - ref|| / ||ref||
double norm_rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double dd = 0, rr = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = double(a[i]) - double(ref[i]);
    dd += e * e;
    rr += double(ref[i]) * double(ref[i]);
  }
  return rr > 0 ? std::sqrt(dd / rr) : std::sqrt(dd);
}

void run_parity(const ParityArgs& args) {
  TREX_CHECK(args.device == "cpu", "parity: device '{}' is not available in this build (use --device cpu)",
             args.device);
  if (args.threads > 0) {
    omp_set_num_threads(args.threads);
    openblas_set_num_threads(args.threads);
  }
  const fs::path dir(args.model_dir);
  const dsv4::ModelConfig cfg = dsv4::load_model_config(dir / "config.json");
  dsv4::ModelOptions opts;
  opts.balance_alpha = 0.0;  // the reference loss has no balance term
  opts.use_mtp = false;      // transformers does not model MTP
  dsv4::ModelConfig run_cfg = cfg;
  run_cfg.n_mtp = 0;
  dsv4::LoadOptions lo;
  lo.allow_unexpected = false;
  lo.filter = [](const std::string& n) { return n.rfind("mtp.", 0) != 0; };
  const auto state = dsv4::load_state_dict(dir, run_cfg, lo);
  Model<float> model(run_cfg, opts);
  model.load(state);

  ckpt::SafetensorsReader io(args.io_file);
  const TensorView ids_v = io.view("input_ids");
  TREX_CHECK(ids_v.shape.size() == 2, "{}: input_ids must be [B, S], got {}", args.io_file, shape_str(ids_v.shape));
  const int64_t B = ids_v.shape[0], S = ids_v.shape[1], N = B * S, V = cfg.vocab_size, d = cfg.hidden;
  const auto ids = to_i32(ids_v, "input_ids");
  const auto labels = to_i32(io.view("labels"), "labels");
  TREX_CHECK(int64_t(labels.size()) == N, "{}: labels must have the shape of input_ids", args.io_file);
  const auto layout = dsv4::SeqLayout::unpacked(B, S);

  const auto t0 = std::chrono::steady_clock::now();
  const double loss = model.forward(ids.data(), labels.data(), layout);
  const auto t1 = std::chrono::steady_clock::now();
  model.params().zero_grads();
  model.backward();
  const auto t2 = std::chrono::steady_clock::now();

  json out;
  bool pass = true;
  const double loss_ref = to_f32(io.view("loss"), "loss").at(0);
  out["loss"] = loss;
  out["loss_ref"] = loss_ref;
  const double loss_err = std::fabs(loss - loss_ref);
  if (!(loss_err < args.tol_loss)) pass = false;

  const auto logits_ref = to_f32(io.view("logits"), "logits");
  TREX_CHECK(int64_t(logits_ref.size()) == N * V, "{}: logits has {} elements, expected {}", args.io_file,
             logits_ref.size(), N * V);
  const double logits_err = max_rel(model.logits(), logits_ref.data(), logits_ref.size());
  out["logits_max_rel_err"] = logits_err;
  if (!(logits_err < args.tol_act)) pass = false;

  double hidden_err = 0;
  json per_layer = json::array();
  for (int64_t i = 0; i <= cfg.n_layers; ++i) {
    const std::string key = fmt::format("hidden_states.{}", i);
    if (!io.contains(key)) continue;
    const auto ref = to_f32(io.view(key), key);
    const bool last = i == cfg.n_layers;
    const int64_t expect = last ? N * d : N * cfg.hc_mult * d;
    TREX_CHECK(int64_t(ref.size()) == expect, "{}: {} has {} elements, expected {}", args.io_file, key, ref.size(),
               expect);
    const double e = max_rel(last ? model.final_normed() : model.layer_input(i), ref.data(), ref.size());
    per_layer.push_back(e);
    hidden_err = std::max(hidden_err, e);
  }
  out["hidden_max_rel_err"] = hidden_err;
  out["hidden_rel_err_per_layer"] = per_layer;
  if (!(hidden_err < args.tol_act)) pass = false;

  // CSA selections, compared as sets per query (the order within a row is not meaningful).
  int64_t queries = 0, matched = 0;
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    const std::string key = fmt::format("indexer_topk.{}", l);
    if (!io.contains(key)) continue;
    const TensorView v = io.view(key);
    const int64_t k = v.shape.back();
    const auto& ours = model.attention_saved(l).topk;
    TREX_CHECK(int64_t(ours.size()) == N * k, "parity: layer {} kept {} selections, the fixture has {} x {}", l,
               ours.size(), N, k);
    for (int64_t t = 0; t < N; ++t) {
      std::multiset<int64_t> a, r;
      for (int64_t j = 0; j < k; ++j) {
        a.insert(ours[size_t(t * k + j)]);
        r.insert(v.dtype == DType::I64 ? v.as<int64_t>()[t * k + j] : int64_t(v.as<int32_t>()[t * k + j]));
      }
      ++queries;
      matched += a == r;
    }
  }
  const double topk_match = queries ? double(matched) / double(queries) : 1.0;
  out["topk_match"] = topk_match;
  out["topk_queries"] = queries;
  if (matched != queries) pass = false;

  if (!args.grads_file.empty()) {
    ckpt::SafetensorsReader gr(args.grads_file);
    auto& P = model.params();
    std::set<std::string> covered;
    std::string worst_name;
    double worst = -1;
    json failing = json::array();
    const int64_t E = cfg.n_routed_experts, f = cfg.moe_inter;
    for (const std::string& tname : gr.names()) {
      const auto ref = to_f32(gr.view(tname), tname);
      std::vector<float> ours;
      int64_t layer = 0;
      bool gate_up = false;
      std::string label;
      if (dsv4::parse_transformers_stacked_key(tname, &layer, &gate_up)) {
        // gate_up_proj [E, 2f, d] = per expert w1 rows then w3 rows; down_proj [E, d, f] = per expert w2.
        for (int64_t e = 0; e < E; ++e)
          for (int w : gate_up ? std::vector<int>{1, 3} : std::vector<int>{2}) {
            const std::string n = dsv4::official_expert_key(fmt::format("layers.{}", layer), e, w);
            const float* g = P.grad(n);
            ours.insert(ours.end(), g, g + P.info(n).numel);
            covered.insert(n);
          }
        label = fmt::format("layers.{}.ffn.experts.*.{}", layer, gate_up ? "w1+w3" : "w2");
      } else {
        const std::string n = dsv4::transformers_to_official(tname);
        TREX_CHECK(P.has(n), "parity: the grads file has '{}' ({}), which the model does not have", tname, n);
        const float* g = P.grad(n);
        ours.assign(g, g + P.info(n).numel);
        covered.insert(n);
        label = n;
      }
      TREX_CHECK(ours.size() == ref.size(), "parity: gradient '{}' has {} elements, ours {}", tname, ref.size(),
                 ours.size());
      const double e = norm_rel(ours, ref);
      if (e > worst) worst = e, worst_name = label;
      if (!(e < args.tol_grad)) {
        pass = false;
        failing.push_back({{"name", label}, {"rel_err", e}});
      }
    }
    (void)f;
    out["worst_grad"] = {{"name", worst_name}, {"rel_err", worst}};
    out["grads_compared"] = gr.size();
    if (!failing.empty()) out["failing_grads"] = failing;
    // Parameters the reference gives no gradient: reported with our gradient norm, never silently skipped.
    json no_ref = json::array();
    json missing = json::array();
    for (const auto& p : P.entries()) {
      if (covered.count(p.name)) continue;
      const float* g = P.arena_grad(p);
      double nn = 0;
      for (int64_t i = 0; i < p.numel; ++i) nn += double(g[i]) * double(g[i]);
      if (p.lm_grad) {
        missing.push_back(p.name);
        pass = false;
      } else {
        no_ref.push_back({{"name", p.name}, {"our_grad_norm", std::sqrt(nn)}});
      }
    }
    out["no_reference_grad"] = no_ref;
    if (!missing.empty()) out["missing_reference_grad"] = missing;
  }
  out["forward_ms"] = std::chrono::duration<double, std::milli>(t1 - t0).count();
  out["backward_ms"] = std::chrono::duration<double, std::milli>(t2 - t1).count();
  out["threads"] = omp_get_max_threads();
  out["pass"] = pass;
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  if (!pass) exit_with(1);
}

const bool registered = register_command(
    {"parity", "compare the CPU model's forward/backward with a golden fixture (logits, hidden states, grads)",
     [](CLI::App& sub) {
       auto a = std::make_shared<ParityArgs>();
       sub.add_option("--model", a->model_dir, "model directory: config.json + safetensors")->required();
       sub.add_option("--io", a->io_file, "fixture io.safetensors (input_ids, labels, logits, loss, ...)")
           ->required();
       sub.add_option("--grads", a->grads_file, "fixture grads.safetensors (transformers names)");
       sub.add_option("--device", a->device, "cpu")->capture_default_str();
       sub.add_option("--threads", a->threads, "OpenMP/BLAS threads (0 = default)");
       sub.callback([a] { run_parity(*a); });
     }});

}  // namespace
}  // namespace trex::cli
