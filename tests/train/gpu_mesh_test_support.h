// The setup the GPU mesh tests of test_train_gpu share, so that each test file holds only what it checks:
//  - Trainer-level layout tests (a layout's run against the one-rank run of the same global batch): the corpus,
//    the tiny config sized to its tokenizer, the train options and run config they all use, every rank of a
//    layout as a thread under the Trainer, and the per-step comparison with its named bounds;
//  - model-level pipeline tests (GpuModel + GpuPipeline driven by hand): the global batch, the optimiser step,
//    the one-rank reference of the batch, and the mesh's thread groups.
// Definitions in gpu_mesh_test_support_gpu.cpp (the _gpu suffix puts it into test_train_gpu).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "data/bpe_trainer.h"
#include "data/shards.h"
#include "kernels/cuda/adamw.h"
#include "model/dsv4/config.h"
#include "model/dsv4/seq_layout.h"
#include "train/config.h"
#include "train/cuda/gpu_mesh_engine.h"
#include "train/dsv4_trainable.h"
#include "train/trainer.h"

namespace trex::testing {

// ---- Trainer-level layout tests ----

// n lines line(0), ..., line(n - 1): a TinyCorpus's texts (tiny_corpus.h).
std::vector<std::string> corpus_lines(const std::function<std::string(int)>& line, int n = 60);

// The tiny GPU config (tiny_gpu_config.h) with its vocabulary grown to hold the corpus tokenizer's ids, rounded
// up to a multiple of 64 (the head's GEMM tile).
dsv4::ModelConfig with_corpus_vocab(dsv4::ModelConfig c, const data::Tokenizer& tok);

// The layout tests' options: no balance loss and no MTP (the recipe test turns them on), router bias updates at
// 1e-3; `deterministic`: the fixed-order attention backward, so that layouts differ only by summation order
// across ranks.
train::Dsv4TrainOptions layout_train_options(bool deterministic);

inline constexpr const char* kLayoutAdamW =
    "{kind: adamw, clip_grad_norm: 1.0, adamw: {eps: 1.0e-8, decay_vectors: true}}";
// Muon with AdamW without decay on vectors, as the Muon dp tests (test_gpu_mesh_engine_gpu.cpp).
inline constexpr const char* kLayoutMuon =
    "{kind: muon, clip_grad_norm: 1.0, adamw: {eps: 1.0e-8, decay_vectors: false}}";

// A layout test's run config: 6 steps of grad_accum micro-batches of 2 sequences of 64 tokens, warm-up 2,
// lr 3e-3 -> 3e-4, the given optimizer and checkpoint policy; `extra`: more top-level YAML lines (ending in a
// newline), before the parallel line.
struct LayoutRunYaml {
  int seed = 3;
  std::string model = "{type: dsv4, balance_alpha: 0}";
  int grad_accum = 8;
  std::string optimizer = kLayoutAdamW;
  std::string checkpoint = "{every: 3, keep_last: 2}";
  std::string extra;
};
// `parallel_line`: "parallel: {...}\n" (empty: the one-GPU default). `file` names the config in errors.
train::TrainConfig layout_run_config(const LayoutRunYaml& y, const std::string& parallel_line, const std::string& file);

// Trainer options without the progress bar; stop >= 0: TrainerOptions::stop_at.
train::TrainerOptions quiet_trainer(int64_t stop = -1);

// Runs on a rank's thread after its Trainer run: collective reads (engine.value) go here, every rank alike.
using AfterRankRun = std::function<void(int rank, train::GpuMeshEngine& engine, const train::TrainResult& res)>;
// Every rank of the config's layout as a thread of this process (a thread group of `ranks` with the given
// timeout; a rank that throws aborts the group, so the others stop too), each a GpuMeshEngine under the Trainer
// writing to `out`.
void train_on_thread_ranks(const train::TrainConfig& cfg, const dsv4::ModelConfig& model,
                           const train::Dsv4TrainOptions& opts, const data::ShardDataset& ds, int ranks,
                           const std::filesystem::path& out, int64_t stop = -1, double timeout_s = 120.0,
                           const AfterRankRun& after = {});

// How far a layout's step may be from the one-rank run's: both run the same global batch in bf16, in another
// summation order (and, across stages and DP, another reduction tree), which the AdamW steps amplify.
struct StepBounds {
  double loss_rel;       // |loss - ref| / ref
  double grad_norm_rel;  // |norm - ref| / ref
};
inline constexpr StepBounds kLayoutStepBounds{5e-3, 5e-2};

// Further checks of step i's metrics lines (the reference's, the layout's) inside the comparison's loop; a fatal
// failure in it ends the comparison.
using StepCheck = std::function<void(size_t i, const nlohmann::json& ref, const nlohmann::json& got)>;
// metrics.jsonl of `dir` against `ref_dir`'s: both hold `steps` lines; steps [from, steps) have their loss and
// gradient norm within `b` and the same target count (the same global batch). Prints each step as
// "  <what> step i: ...".
void expect_steps_match(const std::filesystem::path& ref_dir, const std::filesystem::path& dir,
                        const std::string& what, size_t from = 0, size_t steps = 6,
                        const StepBounds& b = kLayoutStepBounds, const StepCheck& more = {});
// A run stopped and resumed from its step-`resumed_at` checkpoint (steps up to it from the first layout, the rest
// from the layout that resumed) against the uninterrupted reference's 6 steps: the same step numbers and target
// counts (the resumed data position), each loss within `loss_rel`.
void expect_resumed_run_matches(const std::filesystem::path& ref_dir, const std::filesystem::path& dir,
                                const std::string& what, double loss_rel, size_t resumed_at = 3);
// The last step's loss below the first's (training moved).
void expect_loss_falls(const std::filesystem::path& dir, const std::string& what);

// max |a - b| (infinity for a non-finite difference).
double max_abs(const std::vector<float>& a, const std::vector<float>& b);
// A run directory copied whole (the resume tests start from a copy of a stopped run).
void copy_run(const std::filesystem::path& from, const std::filesystem::path& to);

// ---- model-level pipeline tests ----

// The tiny GPU config with n layers (its sliding / CSA / HCA pattern repeated; the first layer hash-routed).
dsv4::ModelConfig tiny_gpu_config_layers(int64_t n, const std::string& where);

// A global batch of `micro` micro-batches of one `seq`-token sequence: random ids (seed) and some unlabelled
// positions, differently many per micro-batch (so that the loss normaliser is the step's, not a mean).
void make_global_batch(int64_t vocab, int64_t micro, int64_t seq, uint32_t seed, std::vector<int32_t>& ids,
                       std::vector<int32_t>& labels);
// The labelled targets of such a batch (label of the next position, within each sequence).
int64_t count_targets(const std::vector<int32_t>& labels, int64_t seq);

// Two micro-batches' inputs of a pipeline stage, for the stage tests that run both in flight (recompute, arena):
// random ids [2, N] and an incoming stream gradient [2, N * hc * d] ~ N(0, 1e-2), from `seed`.
struct TwoMicroBatchStageInputs {
  std::vector<int32_t> ids;
  std::vector<float> dx;
};
TwoMicroBatchStageInputs two_micro_batch_stage_inputs(const dsv4::ModelConfig& cfg, const dsv4::SeqLayout& mb,
                                                      uint32_t seed);

bool is_expert_tensor(const std::string& name);  // a routed expert's (".ffn.experts.")

using TensorsByName = std::map<std::string, std::vector<float>>;
// One GPU model over the whole batch: every micro-batch in order, accumulated under one begin_step, `steps`
// AdamW steps (lr 1e-3, weight decay 0.1) from init_random(5).
struct OneRankReference {
  std::vector<double> losses;         // per step
  TensorsByName init, grads, final;   // values at init, gradients of step 1, values after the last step
  double grad_norm = 0;               // step 1's
  int64_t n_params = 0;
};
OneRankReference one_rank_reference(const dsv4::ModelConfig& cfg, const std::vector<int32_t>& ids,
                                    const std::vector<int32_t>& labels, int64_t micro, int64_t seq, int steps);

// The optimiser step the pipeline tests take (lr 1e-3, weight decay 0.1).
cuda::AdamWStep pipeline_adamw(int step);

// A pp x dp (x ep) mesh's groups, each its own thread group: per stage a DP group of D ranks and D / EP expert
// groups, per DP index `directions` pipeline groups of P ranks (2: activations and gradients; 4: with the
// interleaved schedule's wrap-around pair).
class PipelineMeshGroups {
 public:
  PipelineMeshGroups(int P, int D, int EP, int directions, double timeout_s = 120.0);
  comm::Communicator* dp(int stage, int d) const;
  comm::Communicator* ep(int stage, int d) const;  // null without expert parallelism
  comm::Communicator& direction(int k, int stage, int d) const;

 private:
  int D_, EP_;
  std::vector<std::vector<std::unique_ptr<comm::Communicator>>> dp_, ep_;
  std::vector<std::vector<std::vector<std::unique_ptr<comm::Communicator>>>> dir_;  // [k][d][stage]
};

}  // namespace trex::testing
