#include "model/dsv4/parity.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/model.h"
#include "model/dsv4/naming.h"

namespace trex::dsv4 {

using json = nlohmann::json;

namespace parity_detail {

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

double max_rel(const float* a, const float* ref, size_t n) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; ++i) {
    md = std::max(md, std::fabs(double(a[i]) - double(ref[i])));
    mr = std::max(mr, std::fabs(double(ref[i])));
  }
  return mr > 0 ? md / mr : md;
}

double norm_rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double dd = 0, rr = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = double(a[i]) - double(ref[i]);
    dd += e * e;
    rr += double(ref[i]) * double(ref[i]);
  }
  return rr > 0 ? std::sqrt(dd / rr) : std::sqrt(dd);
}

SelectionMatch indexer_selection_match(const ckpt::SafetensorsReader& io, const Model<float>& model, int64_t N,
                                       bool strict) {
  SelectionMatch m;
  for (int64_t l = 0; l < model.config().n_layers; ++l) {
    const std::string key = fmt::format("indexer_topk.{}", l);
    if (!io.contains(key)) continue;
    const TensorView v = io.view(key);
    const int64_t k = v.shape.back();
    const auto& ours = model.attention_saved(l).topk;
    if (int64_t(ours.size()) != N * k) {
      TREX_CHECK(!strict, "parity: layer {} kept {} selections, the fixture has {} x {}", l, ours.size(), N, k);
      continue;
    }
    for (int64_t t = 0; t < N; ++t) {
      std::multiset<int64_t> a, r;
      for (int64_t j = 0; j < k; ++j) {
        a.insert(ours[size_t(t * k + j)]);
        r.insert(v.dtype == DType::I64 ? v.as<int64_t>()[t * k + j] : int64_t(v.as<int32_t>()[t * k + j]));
      }
      ++m.queries;
      m.matched += a == r;
    }
  }
  return m;
}

std::vector<float> our_grad_for(const std::string& tname, const ModelConfig& cfg, const ParamTable<float>& P,
                                const GradOf& grad_of,
                                std::set<std::string>* covered, std::string* label) {
  std::vector<float> ours;
  int64_t layer = 0;
  bool gate_up = false;
  if (parse_transformers_stacked_key(tname, &layer, &gate_up)) {
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e)
      for (int w : gate_up ? std::vector<int>{1, 3} : std::vector<int>{2}) {
        const std::string n = official_expert_key(fmt::format("layers.{}", layer), e, w);
        const std::vector<float> g = grad_of(n);
        ours.insert(ours.end(), g.begin(), g.end());
        covered->insert(n);
      }
    *label = fmt::format("layers.{}.ffn.experts.*.{}", layer, gate_up ? "w1+w3" : "w2");
  } else {
    const std::string n = transformers_to_official(tname);
    TREX_CHECK(P.has(n), "parity: the grads file has '{}' ({}), which the model does not have", tname, n);
    ours = grad_of(n);
    covered->insert(n);
    *label = n;
  }
  return ours;
}

}  // namespace parity_detail

using namespace parity_detail;

json parity_cpu(const ParityOptions& args) {
  const fs::path dir(args.model_dir);
  const std::string io_name = args.io_file.string();
  const ModelConfig cfg = load_model_config(dir / "config.json");
  ModelOptions opts;
  opts.balance_alpha = 0.0;  // the reference loss has no balance term
  opts.use_mtp = false;      // transformers does not model MTP
  ModelConfig run_cfg = cfg;
  run_cfg.n_mtp = 0;
  LoadOptions lo;
  lo.allow_unexpected = false;
  lo.filter = [](const std::string& n) { return n.rfind("mtp.", 0) != 0; };
  const auto state = load_state_dict(dir, run_cfg, lo);
  Model<float> model(run_cfg, opts);
  model.load(state);

  ckpt::SafetensorsReader io(args.io_file);
  const TensorView ids_v = io.view("input_ids");
  TREX_CHECK(ids_v.shape.size() == 2, "{}: input_ids must be [B, S], got {}", io_name, shape_str(ids_v.shape));
  const int64_t B = ids_v.shape[0], S = ids_v.shape[1], N = B * S, V = cfg.vocab_size, d = cfg.hidden;
  const auto ids = to_i32(ids_v, "input_ids");
  const auto labels = to_i32(io.view("labels"), "labels");
  TREX_CHECK(int64_t(labels.size()) == N, "{}: labels must have the shape of input_ids", io_name);
  const auto layout = SeqLayout::unpacked(B, S);

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
  TREX_CHECK(int64_t(logits_ref.size()) == N * V, "{}: logits has {} elements, expected {}", io_name,
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
    TREX_CHECK(int64_t(ref.size()) == expect, "{}: {} has {} elements, expected {}", io_name, key, ref.size(),
               expect);
    const double e = max_rel(last ? model.final_normed() : model.layer_input(i), ref.data(), ref.size());
    per_layer.push_back(e);
    hidden_err = std::max(hidden_err, e);
  }
  out["hidden_max_rel_err"] = hidden_err;
  out["hidden_rel_err_per_layer"] = per_layer;
  if (!(hidden_err < args.tol_act)) pass = false;

  // CSA selections, compared as sets per query.
  const parity_detail::SelectionMatch sel = parity_detail::indexer_selection_match(io, model, N, /*strict=*/true);
  out["topk_match"] = sel.fraction();
  out["topk_queries"] = sel.queries;
  if (sel.matched != sel.queries) pass = false;

  if (!args.grads_file.empty()) {
    ckpt::SafetensorsReader gr(args.grads_file);
    auto& P = model.params();
    std::set<std::string> covered;
    std::string worst_name;
    double worst = -1;
    json failing = json::array();
    const GradOf grad_of = [&P](const std::string& n) {
      const float* g = P.grad(n);
      return std::vector<float>(g, g + P.info(n).numel);
    };
    for (const std::string& tname : gr.names()) {
      const auto ref = to_f32(gr.view(tname), tname);
      std::string label;
      const std::vector<float> ours = our_grad_for(tname, cfg, P, grad_of, &covered, &label);
      TREX_CHECK(ours.size() == ref.size(), "parity: gradient '{}' has {} elements, ours {}", tname, ref.size(),
                 ours.size());
      const double e = norm_rel(ours, ref);
      if (e > worst) worst = e, worst_name = label;
      if (!(e < args.tol_grad)) {
        pass = false;
        failing.push_back({{"name", label}, {"rel_err", e}});
      }
    }
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
  return out;
}

#ifndef TREX_HAVE_CUDA
json parity_cuda(const ParityOptions&) {
  fail("parity: --device cuda needs a build with CUDA (TREX_CUDA=ON); use --device cpu");
}
#endif

}  // namespace trex::dsv4
