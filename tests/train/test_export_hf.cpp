// `trex train` -> `trex export-hf` -> reload: the exported Hugging Face directory (both namings, bf16 and
// f32) must give the logits of the trained checkpoint, through the generic loader and through the
// `trex parity` loading path (MTP filtered out). Also: `model.init_from_run` starts an SFT run from the CPT
// run's newest weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "core/dtype.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/config.h"
#include "model/dsv4/model.h"
#include "train/dsv4_trainable.h"
#include "train/state_checkpoint.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace trex;

namespace {

int sh(const std::string& cmd, std::string* out = nullptr) {
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) s.append(buf, n);
  const int rc = ::pclose(p);
  if (out) *out = s;
  return WEXITSTATUS(rc);
}

constexpr uint64_t kSeed = 77;

// A tiny DeepSeek-V4 exercising every block kind: sliding, CSA (ratio 4), HCA (ratio 8), a hash layer, MTP.
json tiny_dsv4() {
  return json::parse(R"({
    "vocab_size": 320, "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 16, "qk_rope_head_dim": 8, "q_lora_rank": 16, "o_groups": 2,
    "o_lora_rank": 8, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "moe_intermediate_size": 16, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": true, "swiglu_limit": 10.0, "index_n_heads": 2, "index_head_dim": 8, "index_topk": 4,
    "sliding_window": 8, "compress_ratios": [0, 4, 8, 0], "num_hash_layers": 1, "hc_mult": 2,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 64, "beta_fast": 32,
                     "beta_slow": 1},
    "max_position_embeddings": 256, "num_nextn_predict_layers": 1, "tie_word_embeddings": false,
    "bos_token_id": 0, "eos_token_id": 1})");
}

json run_config(const fs::path& d, const std::string& format, double lr, int64_t steps) {
  return json{{"seed", kSeed},
              {"model", {{"type", "dsv4"}, {"bias_update_speed", 0.0}, {"dsv4", tiny_dsv4()}}},
              {"data",
               {{"jsonl", {(d / (format + ".jsonl")).string()}},
                {"tokenizer", (d / "tok.json").string()},
                {"format", format},
                {"seq_len", 32},
                {"batch_size", 2}}},
              {"schedule", {{"lr", lr}, {"min_lr", 0.0}, {"warmup_steps", 1}}},
              {"train", {{"max_steps", steps}}},
              {"checkpoint", {{"every", steps}}}};
}

// Every parameter and buffer of the run's newest checkpoint plus the seed's tid2eid tables, official names.
dsv4::StateDict checkpoint_state(const fs::path& run, const dsv4::ModelConfig& mc) {
  auto last = train::latest_checkpoint(run / "checkpoints");
  EXPECT_TRUE(last.has_value());
  train::Dsv4Trainable model(mc, {}, kSeed);
  ckpt::SafetensorsReader r(*last / "model.safetensors");
  dsv4::StateDict sd;
  for (const auto& p : model.params()) {
    TensorView v = r.view(p.name);
    HostTensor t(DType::F32, p.shape);
    std::memcpy(t.view.data, v.data, v.nbytes());
    sd.emplace(p.name, std::move(t));
  }
  for (auto& [name, table] : model.model().params().tid2eid) {
    HostTensor t(DType::I64, {mc.vocab_size, mc.topk});
    for (size_t i = 0; i < table.size(); ++i) t.view.as<int64_t>()[i] = table[i];
    sd.emplace(name, std::move(t));
  }
  return sd;
}

struct Batch {
  int64_t B = 2, S = 24;
  std::vector<int32_t> ids, labels;
};

Batch fixed_batch(int64_t vocab) {
  Batch b;
  for (int64_t i = 0; i < b.B * b.S; ++i) b.ids.push_back(int32_t((i * 37 + 11) % vocab));
  for (int64_t i = 0; i < b.B * b.S; ++i) b.labels.push_back((i + 1) % b.S == 0 ? -1 : b.ids[size_t(i + 1)]);
  return b;
}

std::vector<float> logits_of(const dsv4::ModelConfig& mc, const dsv4::StateDict& sd, const Batch& b,
                             bool use_mtp) {
  dsv4::ModelOptions o;
  o.use_mtp = use_mtp;
  dsv4::Model<float> m(mc, o);
  m.load(sd);
  const double loss = m.forward(b.ids.data(), b.labels.data(), dsv4::SeqLayout::unpacked(b.B, b.S));
  EXPECT_TRUE(std::isfinite(loss));
  return std::vector<float>(m.logits(), m.logits() + b.B * b.S * mc.vocab_size);
}

double max_rel(const std::vector<float>& a, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    md = std::max(md, std::fabs(double(a[i]) - double(ref[i])));
    mr = std::max(mr, std::fabs(double(ref[i])));
  }
  return md / mr;
}

class ExportHf : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("trex_export_hf_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream sft(dir_ / "sft.jsonl"), cpt(dir_ / "cpt.jsonl");
    for (int i = 0; i < 40; ++i) {
      const std::string q =
          "Maximise " + std::to_string(i) + " x + y subject to x + y <= " + std::to_string(i + 3);
      const std::string a =
          "Set x = " + std::to_string(i + 3) + ", y = 0; the optimum is " + std::to_string(i * (i + 3)) + ".";
      sft << json{{"messages", {{{"role", "user"}, {"content", q}}, {{"role", "assistant"}, {"content", a}}}}}
                 .dump()
          << "\n";
      cpt << json{{"text", q + ". " + a}}.dump() << "\n";
    }
    sft.close();
    cpt.close();
    const std::string bin = TREX_BINARY;
    std::string out;
    ASSERT_EQ(
        sh(bin + " tokenizer train --input " + (dir_ / "cpt.jsonl").string() + " " +
               (dir_ / "sft.jsonl").string() + " --vocab-size 320 --out " + (dir_ / "tok.json").string(),
           &out),
        0)
        << out;
    std::ofstream(dir_ / "cpt.json") << run_config(dir_, "cpt", 3e-3, 3).dump();
    ASSERT_EQ(sh(bin + " train " + (dir_ / "cpt.json").string() + " --out " + (dir_ / "cpt_run").string() +
                     " --no-progress",
                 &out),
              0)
        << out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path dir_;
};
fs::path ExportHf::dir_;

TEST_F(ExportHf, ReloadGivesTheTrainedLogitsInBothNamingsAndDtypes) {
  const dsv4::ModelConfig mc = dsv4::parse_model_config(tiny_dsv4(), "tiny_dsv4");
  const dsv4::StateDict trained = checkpoint_state(dir_ / "cpt_run", mc);
  // The bf16 reference: every tensor the export narrows, rounded to bf16 here.
  dsv4::StateDict rounded;
  for (const auto& [name, t] : trained) {
    HostTensor c(t.view.dtype, t.view.shape);
    std::memcpy(c.view.data, t.view.data, t.view.nbytes());
    if (t.view.dtype == DType::F32 && !dsv4::keeps_fp32(name))
      for (int64_t i = 0; i < c.view.numel(); ++i)
        c.view.as<float>()[i] = bf16_to_f32(f32_to_bf16(c.view.as<float>()[i]));
    rounded.emplace(name, std::move(c));
  }
  const Batch b = fixed_batch(mc.vocab_size);
  const auto ref_f32 = logits_of(mc, trained, b, true);
  const auto ref_bf16 = logits_of(mc, rounded, b, true);
  ASSERT_GT(max_rel(ref_bf16, ref_f32), 0.0) << "bf16 rounding should change something";

  for (const std::string dialect : {"official", "transformers"}) {
    for (const std::string dtype : {"f32", "bf16"}) {
      SCOPED_TRACE(dialect + " " + dtype);
      const fs::path hf = dir_ / ("hf_" + dialect + "_" + dtype);
      std::string out;
      ASSERT_EQ(sh(std::string(TREX_BINARY) + " export-hf " + (dir_ / "cpt_run").string() + " --out " +
                       hf.string() + " --dtype " + dtype + " --dialect " + dialect,
                   &out),
                0)
          << out;
      // The generic loader: config.json from the export, every tensor the config implies.
      const dsv4::ModelConfig loaded_cfg = dsv4::load_model_config(hf / "config.json");
      ASSERT_EQ(loaded_cfg.vocab_size, mc.vocab_size);
      ASSERT_EQ(loaded_cfg.n_layers, mc.n_layers);
      const dsv4::StateDict sd = dsv4::load_state_dict(hf, loaded_cfg);
      const auto got = logits_of(loaded_cfg, sd, b, true);
      if (dtype == "f32") {
        EXPECT_EQ(got, ref_f32);
      } else {
        EXPECT_LT(max_rel(got, ref_bf16), 1e-2);
        EXPECT_LT(max_rel(got, ref_f32), 5e-2);
      }
      // The `trex parity` path: no MTP in the config, MTP tensors filtered out, no unexpected tensor.
      dsv4::ModelConfig parity_cfg = loaded_cfg;
      parity_cfg.n_mtp = 0;
      dsv4::LoadOptions lo;
      lo.filter = [](const std::string& n) { return n.rfind("mtp.", 0) != 0; };
      const auto parity_logits = logits_of(parity_cfg, dsv4::load_state_dict(hf, parity_cfg, lo), b, false);
      EXPECT_EQ(parity_logits, got);
      // The export streams tensor by tensor from the checkpoint; it must write exactly what saving the whole
      // state at once writes (every tensor's bytes, the hash tables included).
      const fs::path whole = dir_ / ("whole_" + dialect + "_" + dtype);
      dsv4::save_state_dict(whole, trained, mc,
                            dialect == "official" ? dsv4::Dialect::Official : dsv4::Dialect::Transformers,
                            dtype == "f32" ? DType::F32 : DType::BF16);
      const ckpt::SafetensorsReader a(hf), w(whole);
      ASSERT_EQ(a.names(), w.names());
      for (const std::string& n : a.names()) {
        const TensorView x = a.view(n), y = w.view(n);
        ASSERT_EQ(x.dtype, y.dtype) << n;
        ASSERT_EQ(x.shape, y.shape) << n;
        ASSERT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << n << ": bytes differ";
      }
    }
  }
}

TEST_F(ExportHf, InitFromRunStartsSftFromTheCptWeights) {
  const std::string bin = TREX_BINARY;
  const dsv4::ModelConfig mc = dsv4::parse_model_config(tiny_dsv4(), "tiny_dsv4");
  // lr 1e-30 for one step: the weights cannot move (|update| far below one ulp of any trained weight), so
  // the SFT checkpoint shows the weights the run started from.
  json with_init = run_config(dir_, "sft", 1e-30, 1);
  with_init["model"]["init_from_run"] = (dir_ / "cpt_run").string();
  std::ofstream(dir_ / "sft_init.json") << with_init.dump();
  std::ofstream(dir_ / "sft_scratch.json") << run_config(dir_, "sft", 1e-30, 1).dump();
  std::string out;
  ASSERT_EQ(sh(bin + " train " + (dir_ / "sft_init.json").string() + " --out " +
                   (dir_ / "sft_init").string() + " --no-progress",
               &out),
            0)
      << out;
  ASSERT_EQ(sh(bin + " train " + (dir_ / "sft_scratch.json").string() + " --out " +
                   (dir_ / "sft_scratch").string() + " --no-progress",
               &out),
            0)
      << out;
  const auto cpt = checkpoint_state(dir_ / "cpt_run", mc);
  const auto init = checkpoint_state(dir_ / "sft_init", mc);
  const auto scratch = checkpoint_state(dir_ / "sft_scratch", mc);
  double d_init = 0, d_scratch = 0;
  for (const auto& [name, t] : cpt) {
    if (t.view.dtype != DType::F32) continue;
    const float* a = t.view.as<float>();
    const float* b = init.at(name).view.as<float>();
    const float* c = scratch.at(name).view.as<float>();
    for (int64_t i = 0; i < t.view.numel(); ++i) {
      d_init = std::max(d_init, std::fabs(double(a[i]) - double(b[i])));
      d_scratch = std::max(d_scratch, std::fabs(double(a[i]) - double(c[i])));
    }
  }
  EXPECT_LT(d_init, 1e-20);
  EXPECT_GT(d_scratch, 1e-3);  // control: without init_from_run the run starts from its own random init
  // A run that names a directory without checkpoints is refused with the path.
  json bad = run_config(dir_, "sft", 1e-3, 1);
  bad["model"]["init_from_run"] = (dir_ / "nowhere").string();
  std::ofstream(dir_ / "sft_bad.json") << bad.dump();
  EXPECT_EQ(sh(bin + " train " + (dir_ / "sft_bad.json").string() + " --out " + (dir_ / "sft_bad").string() +
                   " --no-progress",
               &out),
            1);
  EXPECT_NE(out.find("nowhere"), std::string::npos) << out;
}

}  // namespace
