// Parity of the DeepSeek-V4 model against a golden fixture (made by make_fixture.py with Hugging Face
// transformers): the CPU model's forward and backward (logits, loss, every hidden state, the CSA indexer
// selections, every gradient; fixture README tolerances: logits / hidden max|d|/max|ref| < 1e-4, loss |d| < 1e-5,
// each gradient ||d||/||ref|| < 1e-3), or the GPU model's step (bf16 weights and activations) against the CPU fp32
// model loaded with the same bf16-rounded weights (tight) and against the fixture (loose; parity_cuda.cpp says
// why). Each returns a JSON report whose "pass" says whether every tolerance held; `trex parity` prints it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/safetensors.h"
#include "core/tensor.h"
#include "model/dsv4/config.h"
#include "model/dsv4/model.h"
#include "model/dsv4/weights.h"

namespace trex::dsv4 {

struct ParityOptions {
  std::filesystem::path model_dir;   // config.json + safetensors
  std::filesystem::path io_file;     // io.safetensors: input_ids, labels, logits, loss, hidden states, ...
  std::filesystem::path grads_file;  // grads.safetensors (transformers names); empty: no gradient comparison
  double tol_act = 1e-4, tol_loss = 1e-5, tol_grad = 1e-3;  // the CPU comparison's
};

nlohmann::json parity_cpu(const ParityOptions& o);
// Needs a CUDA build (throws otherwise) and a GPU.
nlohmann::json parity_cuda(const ParityOptions& o);

// Shared by the two comparisons.
namespace parity_detail {
std::vector<float> to_f32(const TensorView& v, const std::string& what);
std::vector<int32_t> to_i32(const TensorView& v, const std::string& what);
double max_rel(const float* a, const float* ref, size_t n);             // max |a - ref| / max |ref|
double norm_rel(const std::vector<float>& a, const std::vector<float>& ref);  // ||a - ref|| / ||ref||
// Our gradient for the fixture's tensor `tname` (transformers name), read by official name through grad_of.
// Stacked expert tensors gather every expert: gate_up_proj [E, 2f, d] = per expert w1 rows then w3 rows;
// down_proj [E, d, f] = per expert w2. Adds the official names used to *covered; *label names the comparison.
using GradOf = std::function<std::vector<float>(const std::string&)>;
std::vector<float> our_grad_for(const std::string& tname, const ModelConfig& cfg, const ParamTable<float>& P,
                                const GradOf& grad_of, std::set<std::string>* covered, std::string* label);
// The CSA indexer selections of `model`'s last forward against the fixture's `indexer_topk.<l>` of every layer it
// records, compared as sets per query (the order within a row is not meaningful). A layer whose kept selection
// has another size is an error when `strict`, else skipped.
struct SelectionMatch {
  int64_t queries = 0, matched = 0;
  double fraction() const { return queries ? double(matched) / double(queries) : 1.0; }
};
SelectionMatch indexer_selection_match(const ckpt::SafetensorsReader& io, const Model<float>& model, int64_t N,
                                       bool strict);
}  // namespace parity_detail

}  // namespace trex::dsv4
