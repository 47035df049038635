// The pre-tokenizer stage of a Hugging Face tokenizer.json: splits text into pieces that BPE encodes
// independently. See tokenizer.h for the supported kinds.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace trex::data {

class PreTokenizer {
 public:
  static std::shared_ptr<const PreTokenizer> from_json(const nlohmann::json& j, const std::string& where);
  // DeepSeek-V3's published pre-tokenizer (digits in runs of up to 3, CJK runs, then its word pattern),
  // followed by ByteLevel without a regex: what `trex tokenizer train` writes.
  static nlohmann::json deepseek_v3_json();

  void split(std::string_view text, std::vector<std::string>& pieces) const;
  bool byte_level() const { return byte_level_; }

  struct Step;
  ~PreTokenizer();
  PreTokenizer();

 private:
  std::vector<std::unique_ptr<Step>> steps_;
  bool byte_level_ = false;
};

}  // namespace trex::data
