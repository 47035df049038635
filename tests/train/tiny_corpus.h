// A tiny CPT corpus for the trainer tests: the given texts as a JSONL file, a byte-level BPE learnt from them, and
// packed token shards, in a per-process temporary directory removed with the object.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/bpe_trainer.h"
#include "data/shards.h"

namespace trex::testing {

struct TinyCorpus {
  std::filesystem::path dir;
  data::Tokenizer tok;
  std::unique_ptr<data::ShardDataset> ds;

  TinyCorpus(const std::string& name, const std::vector<std::string>& texts, int64_t vocab_size, int64_t seq_len) {
    dir = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::ofstream f(dir / "c.jsonl");
    data::BpeTrainOptions o;
    o.vocab_size = vocab_size;
    data::BpeTrainer tr(o);
    for (const std::string& t : texts) {
      f << nlohmann::json{{"text", t}}.dump() << "\n";
      tr.add_text(t);
    }
    f.close();
    tok = tr.train();
    data::PrepareOptions po;
    po.seq_len = seq_len;
    data::prepare_shards(tok, {dir / "c.jsonl"}, dir / "shards", po);
    ds = std::make_unique<data::ShardDataset>(dir / "shards");
  }
  ~TinyCorpus() { std::filesystem::remove_all(dir); }
  TinyCorpus(const TinyCorpus&) = delete;
  TinyCorpus& operator=(const TinyCorpus&) = delete;
};

}  // namespace trex::testing
