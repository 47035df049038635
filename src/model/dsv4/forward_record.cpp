#include "model/dsv4/forward_record.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/config.h"
#include "model/dsv4/indexer.h"
#include "model/dsv4/model.h"
#include "model/dsv4/seq_layout.h"

namespace trex::dsv4 {
namespace {

// Tensors to write, owning their bytes (the writer only borrows pointers).
struct Record {
  std::vector<std::string> names;
  std::vector<Shape> shapes;
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<int64_t>> i64;
  std::vector<bool> is_int;

  template <class T>
  void add_float(const std::string& name, Shape shape, const T* data) {
    const size_t n = size_t(numel(shape));
    names.push_back(name);
    shapes.push_back(std::move(shape));
    f32.emplace_back(n);
    for (size_t i = 0; i < n; ++i) f32.back()[i] = float(data[i]);
    i64.emplace_back();
    is_int.push_back(false);
  }
  void add_int(const std::string& name, Shape shape, std::vector<int64_t> data) {
    TREX_ASSERT(int64_t(data.size()) == numel(shape));
    names.push_back(name);
    shapes.push_back(std::move(shape));
    f32.emplace_back();
    i64.push_back(std::move(data));
    is_int.push_back(true);
  }
  void write(const fs::path& out, const json& meta) const {
    std::vector<ckpt::TensorToWrite> t;
    for (size_t i = 0; i < names.size(); ++i) {
      ckpt::TensorToWrite w;
      w.name = names[i];
      w.shape = shapes[i];
      w.dtype = is_int[i] ? DType::I64 : DType::F32;
      w.data = is_int[i] ? static_cast<const void*>(i64[i].data()) : static_cast<const void*>(f32[i].data());
      t.push_back(std::move(w));
    }
    ckpt::write_safetensors(out, t, meta);
  }
};

// Every query's score of every entry of its row ([N, E_max], -inf where the entry is not visible), with the
// indexer's own scoring function on what the forward saved.
template <class T>
std::vector<float> all_indexer_scores(const ModelConfig& cfg, const AttentionSaved<T>& s, int64_t B, int64_t S,
                                      int64_t* e_max) {
  const CompressPlan& plan = s.plan;
  int64_t em = 0;
  for (int64_t b = 0; b < B; ++b)
    em = std::max(em, plan.row_entry_begin[size_t(b + 1)] - plan.row_entry_begin[size_t(b)]);
  *e_max = em;
  const int64_t N = B * S;
  std::vector<int64_t> sel(size_t(N * em), -1);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t e = plan.vis_begin[size_t(i)]; e < plan.vis_end[size_t(i)]; ++e)
      sel[size_t(i * em + (e - plan.row_entry_begin[size_t(i / S)]))] = e;
  IndexerDims dims{cfg.hidden, cfg.q_lora_rank, cfg.index_n_heads, cfg.index_head_dim, cfg.rope_dim, em,
                   cfg.rms_eps};
  std::vector<T> score;
  indexer_score_selected(dims, s.idx, N, sel.data(), score);
  std::vector<float> out(score.size());
  for (size_t j = 0; j < out.size(); ++j)
    out[j] = sel[j] >= 0 ? float(score[j]) : -std::numeric_limits<float>::infinity();
  return out;
}

template <class T>
json run(const fs::path& model_dir, const std::vector<int32_t>& ids, int64_t B, int64_t S, const fs::path& out,
         const ForwardRecordOptions& o) {
  const ModelConfig cfg = load_model_config(model_dir / "config.json");
  for (int32_t id : ids)
    TREX_CHECK(id >= 0 && id < cfg.vocab_size, "forward record: token id {} is outside the vocabulary [0, {})", id,
               cfg.vocab_size);
  ModelConfig run_cfg = cfg;
  run_cfg.n_mtp = 0;  // an outside implementation (transformers) does not model MTP
  ModelOptions mo;
  mo.balance_alpha = 0.0;
  mo.use_mtp = false;
  LoadOptions lo;
  lo.filter = [](const std::string& n) { return n.rfind("mtp.", 0) != 0; };
  Model<T> model(run_cfg, mo);
  model.load(load_state_dict(model_dir, run_cfg, lo));

  const SeqLayout layout = SeqLayout::unpacked(B, S);
  const std::vector<int32_t>& labels = ids;  // shifted inside the loss: position t predicts ids[t + 1]
  const double loss = model.forward(ids.data(), labels.data(), layout);

  const int64_t N = B * S, d = cfg.hidden, V = cfg.vocab_size;
  Record r;
  std::vector<int64_t> ids64(ids.begin(), ids.end());
  r.add_int("input_ids", {B, S}, ids64);
  r.add_int("labels", {B, S}, ids64);
  const double lm = model.loss_parts().lm;
  r.add_float("loss", {1}, &lm);
  r.add_float("logits", {B, S, V}, model.logits());
  for (int64_t l = 0; l < cfg.n_layers; ++l)
    r.add_float(fmt::format("hidden_states.{}", l), {B, S, cfg.hc_mult, d}, model.layer_input(l));
  r.add_float(fmt::format("hidden_states.{}", cfg.n_layers), {B, S, d}, model.final_normed());
  for (int64_t l = 0; l < cfg.n_layers; ++l) {
    if (cfg.attn_types[size_t(l)] == AttnType::CSA) {
      const AttentionSaved<T>& s = model.attention_saved(l);
      const int64_t k = cfg.index_topk;
      TREX_CHECK(int64_t(s.topk.size()) == N * k, "forward record: layer {} kept {} selections, expected {} x {}", l,
                 s.topk.size(), N, k);
      r.add_int(fmt::format("indexer_topk.{}", l), {B, S, k}, s.topk);
      int64_t em = 0;
      std::vector<float> sc = all_indexer_scores(cfg, s, B, S, &em);
      r.add_float(fmt::format("indexer_scores.{}", l), {B, S, em}, sc.data());
    }
    const int32_t* sel = model.router_selection(l);
    r.add_int(fmt::format("router_topk.{}", l), {B, S, cfg.topk}, std::vector<int64_t>(sel, sel + N * cfg.topk));
  }
  json summary = {{"model", model_dir.string()}, {"batch", B},       {"seq", S},
                  {"loss", lm},                  {"total_loss", loss}, {"precision", o.fp64 ? "fp64" : "fp32"}};
  json meta = {{"format", "pt"}, {"producer", "trex record-forward"}, {"precision", summary["precision"]},
               {"model", model_dir.string()}};
  for (auto& [k, v] : meta.items())
    if (!v.is_string()) v = v.dump();
  r.write(out, meta);
  return summary;
}

}  // namespace

json record_forward(const fs::path& model_dir, const std::vector<int32_t>& ids, int64_t B, int64_t S,
                    const fs::path& out, const ForwardRecordOptions& opts) {
  TREX_CHECK(B > 0 && S > 1 && int64_t(ids.size()) == B * S,
             "forward record: need B x S ids with B >= 1 and S >= 2 (got {} ids for {} x {})", ids.size(), B, S);
  return opts.fp64 ? run<double>(model_dir, ids, B, S, out, opts) : run<float>(model_dir, ids, B, S, out, opts);
}

std::vector<int32_t> parse_id_rows(const std::string& text, const std::string& where, int64_t* B, int64_t* S) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail("{}: token ids are not valid JSON ({})", where, e.what());
  }
  TREX_CHECK(j.is_array() && !j.empty(), "{}: expected a JSON list of token ids or a list of such lists", where);
  json rows = j.front().is_array() ? j : json::array({j});
  std::vector<int32_t> ids;
  *B = int64_t(rows.size());
  *S = -1;
  for (size_t b = 0; b < rows.size(); ++b) {
    const json& row = rows[b];
    TREX_CHECK(row.is_array(), "{}: row {} is not a list of token ids", where, b);
    if (*S < 0) *S = int64_t(row.size());
    TREX_CHECK(int64_t(row.size()) == *S, "{}: row {} has {} ids, row 0 has {} (rows must have one length)", where, b,
               row.size(), *S);
    for (size_t t = 0; t < row.size(); ++t) {
      TREX_CHECK(row[t].is_number_integer(), "{}: row {} item {} is not an integer token id", where, b, t);
      ids.push_back(row[t].get<int32_t>());
    }
  }
  return ids;
}

}  // namespace trex::dsv4
