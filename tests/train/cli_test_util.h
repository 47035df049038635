// Helpers for the end-to-end tests that drive the `trex` binary (tests/train/test_distributed_*.cpp,
// test_sharded_checkpoint_cli.cpp): a shell runner, the mpirun prefix for this CI machine, the tiny DeepSeek-V4
// config those runs train, and the corpus -> tokenizer -> shards preparation they share.
#pragma once
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace trex::testing {

// Runs `cmd` with stderr merged; `out` (optional) receives "$ cmd" and the output. Returns the exit status.
inline int sh(const std::string& cmd, std::string* out = nullptr) {
  std::FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  std::string s;
  char buf[4096];
  size_t n;
  while (p && (n = std::fread(buf, 1, sizeof buf, p)) > 0) s.append(buf, n);
  const int rc = p ? ::pclose(p) : -1;
  if (out) *out = "$ " + cmd + "\n" + s;
  return WEXITSTATUS(rc);
}

// Root in CI, an oversubscribed 2-core machine, no CMA single-copy (not allowed in containers), one OpenMP thread.
inline std::string mpirun(int np) {
  return "env OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
         "mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np " +
         std::to_string(np) + " ";
}

// 4 layers (sliding, CSA, sliding, CSA; one hash layer), 4 experts top-2 with a shared expert, MTP on.
inline nlohmann::json tiny_cli_model(int64_t vocab) {
  return {{"vocab_size", vocab}, {"hidden_size", 32}, {"num_hidden_layers", 4}, {"num_attention_heads", 2},
          {"num_key_value_heads", 1}, {"head_dim", 16}, {"qk_rope_head_dim", 8}, {"q_lora_rank", 16},
          {"o_groups", 2}, {"o_lora_rank", 8}, {"n_routed_experts", 4}, {"num_experts_per_tok", 2},
          {"n_shared_experts", 1}, {"moe_intermediate_size", 16}, {"routed_scaling_factor", 1.5},
          {"scoring_func", "sqrtsoftplus"}, {"norm_topk_prob", true}, {"swiglu_limit", 10.0},
          {"index_n_heads", 2}, {"index_head_dim", 8}, {"index_topk", 4}, {"sliding_window", 8},
          {"compress_ratios", {0, 4, 0, 4, 0}}, {"num_hash_layers", 1}, {"hc_mult", 4}, {"hc_sinkhorn_iters", 20},
          {"hc_eps", 1e-6}, {"rms_norm_eps", 1e-6}, {"rope_theta", 10000}, {"compress_rope_theta", 160000},
          {"rope_scaling", {{"type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 64},
                            {"beta_fast", 32}, {"beta_slow", 1}}},
          {"max_position_embeddings", 256}, {"num_nextn_predict_layers", 1}, {"tie_word_embeddings", false},
          {"bos_token_id", 0}, {"eos_token_id", 1}};
}

// Writes a 60-line CPT corpus into `dir`, trains a 300-token tokenizer (dir/tok.json) and packs 32-token shards
// (dir/shards) with `bin`. Returns "" on success, else the failing command's output.
inline std::string prepare_tiny_corpus(const std::filesystem::path& dir, const std::string& bin) {
  {
    std::ofstream f(dir / "c.jsonl");
    for (int i = 0; i < 60; ++i)
      f << nlohmann::json{{"text", "minimise cost: x + " + std::to_string(i % 7) + " y subject to x >= " +
                                       std::to_string(i % 5) + " and y >= 1. "}}
               .dump()
        << "\n";
  }
  std::string out;
  if (sh(bin + " tokenizer train --input " + (dir / "c.jsonl").string() + " --vocab-size 300 --out " +
             (dir / "tok.json").string(), &out) != 0 ||
      sh(bin + " data prepare --tokenizer " + (dir / "tok.json").string() + " --input " + (dir / "c.jsonl").string() +
             " --seq-len 32 --out " + (dir / "shards").string(), &out) != 0)
    return out;
  return "";
}

}  // namespace trex::testing
