// dsv4::record_forward (what python/hf_check/compare.py compares with transformers) on the golden tiny fixture:
// its logits, hidden states and indexer selections must be the fixture's, its full indexer score table must
// agree with the selections it reports, and its router selections with the hash table / the top-k rule.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/forward_record.h"

namespace {

using namespace trex;

std::vector<double> floats(const ckpt::SafetensorsReader& r, const std::string& name) {
  const TensorView v = r.view(name);
  EXPECT_EQ(v.dtype, DType::F32) << name;
  std::vector<double> out(size_t(v.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = v.as<float>()[i];
  return out;
}

std::vector<int64_t> ints(const ckpt::SafetensorsReader& r, const std::string& name) {
  const TensorView v = r.view(name);
  EXPECT_EQ(v.dtype, DType::I64) << name;
  return std::vector<int64_t>(v.as<int64_t>(), v.as<int64_t>() + v.numel());
}

double max_rel(const std::vector<double>& a, const std::vector<double>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double md = 0, mr = 0;
  for (size_t i = 0; i < std::min(a.size(), ref.size()); ++i) {
    md = std::max(md, std::fabs(a[i] - ref[i]));
    mr = std::max(mr, std::fabs(ref[i]));
  }
  return mr > 0 ? md / mr : md;
}

class ForwardRecord : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = shared_dir() / "fixtures" / "deepseek-v4" / "tiny";
    if (!fs::exists(dir_ / "io.safetensors")) GTEST_SKIP() << "fixture not found at " << dir_;
    tmp_ = fs::temp_directory_path() / ("trex_forward_record_" + std::to_string(getpid()));
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    if (!tmp_.empty()) fs::remove_all(tmp_);
  }
  // Records the fixture's input_ids; returns the record's path.
  fs::path record(bool fp64, int64_t* B, int64_t* S) {
    ckpt::SafetensorsReader io(dir_ / "io.safetensors");
    const TensorView v = io.view("input_ids");
    *B = v.shape[0];
    *S = v.shape[1];
    std::vector<int32_t> ids(size_t(v.numel()));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(v.as<int64_t>()[i]);
    const fs::path out = tmp_ / (fp64 ? "rec64.safetensors" : "rec32.safetensors");
    dsv4::ForwardRecordOptions o;
    o.fp64 = fp64;
    const json summary = dsv4::record_forward(dir_, ids, *B, *S, out, o);
    EXPECT_EQ(summary.at("batch").get<int64_t>(), *B);
    EXPECT_EQ(summary.at("precision").get<std::string>(), fp64 ? "fp64" : "fp32");
    return out;
  }
  fs::path dir_, tmp_;
};

TEST_F(ForwardRecord, TinyFixtureLogitsHiddenAndSelections) {
  int64_t B = 0, S = 0;
  ckpt::SafetensorsReader io(dir_ / "io.safetensors");
  const json cfg = read_json_file(dir_ / "config.json");
  const int64_t L = cfg.at("num_hidden_layers"), k = cfg.at("index_topk"), K = cfg.at("num_experts_per_tok");
  const int64_t ratio = cfg.at("compress_rates").at("compressed_sparse_attention");
  for (bool fp64 : {false, true}) {
    SCOPED_TRACE(fp64 ? "fp64" : "fp32");
    ckpt::SafetensorsReader rec(record(fp64, &B, &S));
    EXPECT_EQ(ints(rec, "input_ids"), ints(io, "input_ids"));
    EXPECT_EQ(ints(rec, "labels"), ints(io, "input_ids"));  // transformers' labels: the ids, shifted inside
    EXPECT_LT(max_rel(floats(rec, "logits"), floats(io, "logits")), 1e-4);
    for (int64_t i = 0; i <= L; ++i) {
      const std::string name = "hidden_states." + std::to_string(i);
      EXPECT_LT(max_rel(floats(rec, name), floats(io, name)), 1e-4) << name;
    }
    const double loss = floats(rec, "loss")[0];
    EXPECT_TRUE(std::isfinite(loss) && loss > 0 && loss < 2 * std::log(double(cfg.at("vocab_size").get<int>())));

    int n_csa = 0;
    for (int64_t l = 0; l < L; ++l) {
      const std::string name = "indexer_topk." + std::to_string(l);
      ASSERT_EQ(rec.contains(name), io.contains(name)) << name;
      if (!rec.contains(name)) continue;
      ++n_csa;
      const auto ours = ints(rec, name), ref = ints(io, name);
      const auto scores = floats(rec, "indexer_scores." + std::to_string(l));
      const TensorView sv = rec.view("indexer_scores." + std::to_string(l));
      ASSERT_EQ(sv.shape.size(), 3u);
      const int64_t E = sv.shape[2];
      EXPECT_EQ(E, S / ratio);
      for (int64_t q = 0; q < B * S; ++q) {
        std::multiset<int64_t> a(ours.begin() + q * k, ours.begin() + (q + 1) * k);
        std::multiset<int64_t> r(ref.begin() + q * k, ref.begin() + (q + 1) * k);
        ASSERT_EQ(a, r) << name << " query " << q;
        // The score table: finite exactly on the visible entries; the selection is its top-k.
        const int64_t visible = std::min((q % S + 1) / ratio, E);
        double worst_selected = INFINITY, best_other = -INFINITY;
        for (int64_t e = 0; e < E; ++e) {
          const double s = scores[size_t(q * E + e)];
          ASSERT_EQ(std::isfinite(s), e < visible) << name << " query " << q << " entry " << e;
          if (e >= visible) continue;
          if (a.count(e))
            worst_selected = std::min(worst_selected, s);
          else
            best_other = std::max(best_other, s);
        }
        EXPECT_EQ(int64_t(a.size() - a.count(-1)), std::min(k, visible)) << name << " query " << q;
        if (visible > k) EXPECT_GT(worst_selected, best_other) << name << " query " << q;
      }
    }
    EXPECT_EQ(n_csa, 2);

    // Hash layers route by the token table; score layers pick K distinct experts.
    ckpt::SafetensorsReader model(dir_ / "model.safetensors");
    const auto ids = ints(rec, "input_ids");
    for (int64_t l = 0; l < L; ++l) {
      const auto sel = ints(rec, "router_topk." + std::to_string(l));
      ASSERT_EQ(int64_t(sel.size()), B * S * K);
      const std::string table = "model.layers." + std::to_string(l) + ".mlp.gate.tid2eid";
      if (model.contains(table)) {
        const auto t = ints(model, table);
        for (int64_t q = 0; q < B * S; ++q)
          for (int64_t j = 0; j < K; ++j) ASSERT_EQ(sel[size_t(q * K + j)], t[size_t(ids[size_t(q)] * K + j)]);
      } else {
        for (int64_t q = 0; q < B * S; ++q) {
          std::set<int64_t> s(sel.begin() + q * K, sel.begin() + (q + 1) * K);
          ASSERT_EQ(int64_t(s.size()), K);
          ASSERT_TRUE(*s.begin() >= 0 && *s.rbegin() < cfg.at("n_routed_experts").get<int64_t>());
        }
      }
    }
  }
}

TEST(ForwardRecordIds, ParsesRowsAndRejectsBadInput) {
  int64_t B = 0, S = 0;
  EXPECT_EQ(dsv4::parse_id_rows("[0, 5, 7]", "x", &B, &S), (std::vector<int32_t>{0, 5, 7}));
  EXPECT_EQ(B, 1);
  EXPECT_EQ(S, 3);
  EXPECT_EQ(dsv4::parse_id_rows("[[1, 2], [3, 4]]", "x", &B, &S), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(B, 2);
  auto message = [](const std::string& text) {
    int64_t b = 0, s = 0;
    try {
      dsv4::parse_id_rows(text, "ids.json", &b, &s);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("[[1, 2], [3]]").find("ids.json: row 1 has 1 ids, row 0 has 2"), std::string::npos);
  EXPECT_NE(message("[1, \"a\"]").find("ids.json: row 0 item 1 is not an integer"), std::string::npos);
  EXPECT_NE(message("[1, 2").find("ids.json: token ids are not valid JSON"), std::string::npos);
  EXPECT_NE(message("{}").find("ids.json: expected a JSON list"), std::string::npos);
}

TEST(ForwardRecordIds, RejectsIdsOutsideTheVocabulary) {
  const auto dir = shared_dir() / "fixtures" / "deepseek-v4" / "tiny";
  if (!fs::exists(dir / "model.safetensors")) GTEST_SKIP() << "fixture not found at " << dir;
  const fs::path out = fs::temp_directory_path() / ("trex_forward_record_bad_" + std::to_string(getpid()));
  try {
    dsv4::record_forward(dir, {0, 5, 320}, 1, 3, out);
    ADD_FAILURE() << "no error for id 320 of a 320-token vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 320 is outside the vocabulary [0, 320)"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
