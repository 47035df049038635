// Learns a byte-level BPE from a corpus and returns it as a Tokenizer (which saves as tokenizer.json).
// Ids: the special tokens first (0, 1, ... in the given order, so BOS = 0 and EOS = 1 as in DeepSeek-V4),
// then the 256 byte symbols, then one id per merge. Ties between equally frequent pairs go to the pair
// with the smaller ids, so training is deterministic.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

namespace trex::data {

// DeepSeek-V4's conversation tokens (design §6) in the order the trainer assigns ids.
std::vector<std::string> dsv4_special_tokens();

struct BpeTrainOptions {
  int64_t vocab_size = 4096;  // total, specials and bytes included
  int64_t min_frequency = 2;  // stop when the best pair occurs fewer times
  std::vector<std::string> special_tokens = dsv4_special_tokens();
  nlohmann::json pre_tokenizer;  // null: DeepSeek-V3's (PreTokenizer::deepseek_v3_json)
  bool show_progress = false;
};

class BpeTrainer {
 public:
  explicit BpeTrainer(BpeTrainOptions opts);
  void add_text(std::string_view text);  // pre-tokenizes and counts pieces
  Tokenizer train();
  int64_t pieces_seen() const { return pieces_; }

 private:
  BpeTrainOptions opts_;
  std::shared_ptr<const class PreTokenizer> pre_;
  std::unordered_map<std::string, int64_t> counts_;
  int64_t pieces_ = 0;
};

}  // namespace trex::data
