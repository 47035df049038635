// One forward of the CPU DeepSeek-V4 model on given token ids, with everything an outside implementation (Hugging
// Face transformers, python/hf_check/compare.py) needs to be compared with it, written as one safetensors file:
//   input_ids [B, S] I64, labels [B, S] I64 (= input_ids: transformers' convention, shifted inside the loss),
//   loss [1], logits [B, S, V], hidden_states.i [B, S, n_hc, d] (input of layer i) for i < L and
//   hidden_states.L [B, S, d] (the final normed output), names and layouts as the golden fixtures use them;
//   indexer_topk.l [B, S, k] I64 for each CSA layer l (row-local entry indices, -1 = empty slot) and
//   indexer_scores.l [B, S, E_row] (every query's score of every entry of its row, -inf where not visible);
//   router_topk.l [B, S, K] I64 for every MoE layer (the experts chosen, hash layers included).
// Each row is one document at positions 0..S-1 (no padding, no packing); the MTP module does not run.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/files.h"

namespace trex::dsv4 {

struct ForwardRecordOptions {
  bool fp64 = false;  // run the model in double (the weights are read as fp32 either way)
};

// Loads `model_dir` (config.json + safetensors, official or transformers naming; mtp.* is skipped), runs ids [B, S]
// and writes the record to `out` (a temporary name, then renamed). Returns a summary (shape, loss, precision).
json record_forward(const std::filesystem::path& model_dir, const std::vector<int32_t>& ids, int64_t B, int64_t S,
                    const std::filesystem::path& out, const ForwardRecordOptions& opts = {});

// Parses token ids given as a JSON list (one row) or a list of equal-length lists; `where` names the source in
// errors. Sets *B and *S.
std::vector<int32_t> parse_id_rows(const std::string& text, const std::string& where, int64_t* B, int64_t* S);

}  // namespace trex::dsv4
