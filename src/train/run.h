// `trex train CONFIG --out DIR`: builds the tokenizer, data (preparing shards into DIR/data when the
// config names JSONL), the model (dsv4 or toy) and runs the Trainer; running it again with the same DIR
// resumes from the newest checkpoint there. DIR/config.json records the resolved config; a resume whose
// model, data or seed differ from it is refused.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>

#include "data/shards.h"
#include "data/tokenizer.h"
#include "train/dsv4_trainable.h"
#include "train/trainer.h"

namespace trex::comm {
class Communicator;
}

namespace trex::train {

struct RunOptions {
  int64_t max_steps = -1;  // stop after this many total steps (-1: the config's train.max_steps)
  bool show_progress = true;
  std::string device;  // cpu | cuda; empty: the config's `device` (default cpu)
};

// One process without a `parallel:` section: the Trainer over a LocalEngine; otherwise run_distributed_training.
TrainResult run_training(const std::filesystem::path& config, const std::filesystem::path& out_dir,
                         const RunOptions& opts = {});

// A mesh run (distributed_run.cpp): the world communicator from the launcher (mpirun, srun, torchrun), the
// mesh of the config's parallel section (pure data parallelism over every process when there is none), this
// rank's part of the model and its MeshEngine under the same Trainer loop. Rank 0 prepares the run directory.
TrainResult run_distributed_training(const TrainConfig& cfg, const std::filesystem::path& config,
                                     const std::filesystem::path& out_dir, const RunOptions& opts);

// Shared by both: the model of the config (dsv4 or toy, initialised from the seed); the run directory's
// recorded config and prepared data (returns the shards directory); the dataset's agreement with the config.
std::unique_ptr<Trainable> make_model(const TrainConfig& cfg, const data::Tokenizer& tok);
// model.init_from_run: the tensors of `params` (weights and router biases, by official name) from another run's
// newest checkpoint of either format (e.g. SFT after CPT); the optimiser starts fresh. rank >= 0: a mesh rank
// loading its part (named in errors; rank 0 logs).
void load_run_weights(const std::vector<optim::ParamRef>& params, const std::filesystem::path& run_dir,
                      const std::string& where, int rank = -1);
// The DeepSeek-V4 model config and training options of a dsv4 run config (checks its keys).
void dsv4_model_setup(const TrainConfig& cfg, const data::Tokenizer& tok, dsv4::ModelConfig* mc, Dsv4TrainOptions* opts);
std::filesystem::path prepare_run(const TrainConfig& cfg, const std::filesystem::path& config,
                                  const std::filesystem::path& out_dir, const RunOptions& opts,
                                  const data::Tokenizer& tok);
// prepare_run on rank 0 of `ranks` only (the others wait for it: a shared file system), its error rethrown there
// and reported by every other rank; `ranks` broadcasts host memory. Returns the shards directory.
std::filesystem::path prepare_run_on_lead(const TrainConfig& cfg, const std::filesystem::path& config,
                                          const std::filesystem::path& out_dir, const RunOptions& opts,
                                          const data::Tokenizer& tok, comm::Communicator& ranks);
void check_dataset(const TrainConfig& cfg, const std::filesystem::path& config, const std::filesystem::path& shards,
                   const data::ShardDataset& ds, const data::Tokenizer& tok);

}  // namespace trex::train
