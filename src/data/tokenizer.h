// Byte-level BPE tokenizer that reads and writes Hugging Face tokenizer.json files.
// What is honoured from the file: added_tokens (id, content, special, lstrip, rstrip, single_word), the
// pre_tokenizer (Sequence of Split{Regex|String, behavior Isolated|Removed|MergedWithPrevious|MergedWithNext},
// Digits, ByteLevel{add_prefix_space, use_regex}), and model BPE (vocab, merges as "a b" strings or
// [a, b] pairs, ignore_merges, unk_token). Normalizers other than none, non-byte-level models
// (byte_fallback / sentencepiece) and subword prefixes/suffixes are rejected with an error naming the file.
// The post_processor is not applied: callers add BOS/EOS themselves (chat.h, shards.h).
// Any byte string round-trips: text is split on bytes, not on valid UTF-8 (invalid bytes become their own
// pre-tokenizer characters), and decode() returns the exact bytes.
// Not thread-safe (a piece cache is kept); give each thread its own copy.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace trex::data {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = true, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class PreTokenizer;

class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  Tokenizer(const Tokenizer&);
  Tokenizer& operator=(const Tokenizer&);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  static Tokenizer load(const std::filesystem::path& tokenizer_json);
  static Tokenizer from_json(const nlohmann::json& j, const std::string& where);
  nlohmann::json to_json() const;
  void save(const std::filesystem::path& path) const;  // atomic

  // allow_special=false: special added tokens in `text` are encoded as plain text (use this for data
  // content so a document cannot inject an EOS or a role marker).
  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
  void encode_append(std::string_view text, std::vector<int32_t>& out, bool allow_special = true) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  int64_t vocab_size() const { return int64_t(id_bytes_.size()); }  // max id + 1
  int32_t token_to_id(std::string_view token) const;  // vocab string or added-token content; -1 if absent
  int32_t special_id(std::string_view content) const;  // throws when the tokenizer lacks it
  const std::string& id_to_token(int32_t id) const;   // vocab string (byte-level alphabet) or content
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_; }

  // The pre-tokenizer's pieces of `text` (no added-token splitting), as raw bytes.
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  // BPE of one pre-tokenized piece (raw bytes) appended to out.
  void bpe_piece(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  void build_indexes(const std::string& where);
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;

  std::string source_;                         // where it was loaded from (for errors)
  nlohmann::json pre_tokenizer_json_, decoder_json_, post_processor_json_;
  std::shared_ptr<const PreTokenizer> pre_;
  std::vector<std::string> id_token_;          // vocab string per id ("" for holes)
  std::vector<std::string> id_bytes_;          // raw bytes per id
  std::vector<uint8_t> special_;               // 1 for special added tokens
  std::unordered_map<std::string, int32_t> token_id_;
  std::vector<std::pair<int32_t, int32_t>> merges_;  // in rank order
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_rank_;  // (a,b) -> (rank, merged id)
  int32_t byte_id_[256];
  int32_t unk_id_ = -1;
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;
  std::vector<std::vector<int32_t>> added_by_first_byte_;  // index into added_, longest first
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// GPT-2's byte <-> printable-unicode map used by ByteLevel (byte b is written as code point byte_to_cp[b]).
char32_t byte_level_char(uint8_t b);
int byte_level_byte(char32_t cp);  // -1 when cp is not in the alphabet

}  // namespace trex::data
