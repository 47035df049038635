// Packed, memory-mapped token shards. `trex data prepare` turns JSONL (CPT {"text": ...} or SFT
// {"messages": [...]}) into rows of exactly seq_len tokens; each row holds whole documents back to back
// (a document that does not fit in the rest of a row starts the next one; a text longer than seq_len is cut
// into seq_len chunks, each its own document; a chat longer than seq_len is truncated or dropped, never cut: a
// window of its answer without the question, or of the question without an answer token, would train on
// nothing or on the wrong thing), and the tail of a row is padding.
// Files in the output directory:
//   index.json              format, seq_len, row counts per shard, statistics
//   shard_NNNNN.tokens      uint32 little-endian [rows, seq_len]
//   shard_NNNNN.flags       uint8 [rows, seq_len]: bit0 target (trained), bit1 document start, bit2 padding
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "data/batch.h"
#include "data/chat.h"
#include "data/tokenizer.h"

namespace trex::data {

enum TokenFlag : uint8_t { kTarget = 1, kDocStart = 2, kPad = 4 };

enum class LongChats { Truncate, Drop };
LongChats parse_long_chats(const std::string& s, const std::string& where);  // "truncate" | "drop"

struct PrepareOptions {
  int64_t seq_len = 512;
  int64_t rows_per_shard = 4096;
  std::string format = "auto";  // auto (per line: "text" -> CPT, "messages" -> SFT) | cpt | sft
  bool skip_bad_lines = false;  // false: the first malformed line is a fatal error naming file:line
  ThinkingMode thinking = ThinkingMode::Auto;
  // A chat longer than seq_len: truncate keeps its first seq_len tokens (the prompt and the start of the answer,
  // as SFT trainers' max-length truncation does); drop leaves it out. Either way a chat with no assistant token
  // left in the row is dropped and counted.
  LongChats long_chats = LongChats::Truncate;
  bool show_progress = false;
};

struct PrepareStats {
  int64_t lines = 0, documents = 0, empty_skipped = 0, bad_skipped = 0, split_documents = 0;
  // chats longer than seq_len: kept truncated, dropped (by long_chats: drop, or no assistant token within
  // seq_len), and the longest one's token count
  int64_t truncated_chats = 0, dropped_chats = 0, longest_chat = 0;
  int64_t rows = 0, tokens = 0, target_tokens = 0, pad_tokens = 0;
  std::vector<std::string> bad_examples;  // first few "file:line: why"
  nlohmann::json to_json() const;
};

PrepareStats prepare_shards(const Tokenizer& tok, const std::vector<std::filesystem::path>& inputs,
                            const std::filesystem::path& out_dir, const PrepareOptions& opts);

// Read side: all shards of a directory, memory-mapped.
class ShardDataset {
 public:
  explicit ShardDataset(const std::filesystem::path& dir);
  int64_t rows() const { return total_rows_; }
  int64_t seq_len() const { return seq_len_; }
  const uint32_t* tokens(int64_t row) const;
  const uint8_t* flags(int64_t row) const;
  const nlohmann::json& index() const { return index_; }

 private:
  struct Shard {
    MappedFile tokens, flags;
    int64_t rows, first_row;
  };
  std::vector<Shard> shards_;
  int64_t total_rows_ = 0, seq_len_ = 0;
  nlohmann::json index_;
};

// Fills b with the given rows (labels, positions, document starts derived from the flags). pad_id is the
// input id used on padding positions.
void make_batch(const ShardDataset& ds, const std::vector<int64_t>& rows, int32_t pad_id, Batch& b);

}  // namespace trex::data
