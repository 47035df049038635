#include "data/bpe_trainer.h"

#include <algorithm>
#include <queue>
#include <unordered_set>

#include "core/error.h"
#include "core/progress.h"
#include "data/pre_tokenizer.h"
#include "data/unicode.h"

namespace trex::data {

using json = nlohmann::json;

std::vector<std::string> dsv4_special_tokens() {
  return {"<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<\uff5cUser\uff5c>",
          "<\uff5cAssistant\uff5c>", "<think>", "</think>"};
}

BpeTrainer::BpeTrainer(BpeTrainOptions opts) : opts_(std::move(opts)) {
  if (opts_.pre_tokenizer.is_null()) opts_.pre_tokenizer = PreTokenizer::deepseek_v3_json();
  pre_ = PreTokenizer::from_json(opts_.pre_tokenizer, "tokenizer training");
  TREX_CHECK(pre_->byte_level(), "tokenizer training: the pre_tokenizer must end in ByteLevel");
  TREX_CHECK(opts_.vocab_size >= int64_t(opts_.special_tokens.size()) + 256,
             "tokenizer training: vocab_size {} is below specials + 256 bytes = {}", opts_.vocab_size,
             opts_.special_tokens.size() + 256);
}

void BpeTrainer::add_text(std::string_view text) {
  std::vector<std::string> pieces;
  pre_->split(text, pieces);
  for (auto& p : pieces) ++counts_[p];
  pieces_ += int64_t(pieces.size());
}

static std::string bl_string(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) unicode::append_utf8(s, byte_level_char(b));
  return s;
}

Tokenizer BpeTrainer::train() {
  const int32_t n_special = int32_t(opts_.special_tokens.size());
  // Symbol table: id -> raw bytes. Specials, then bytes.
  std::vector<std::string> sym_bytes;
  for (const auto& s : opts_.special_tokens) sym_bytes.push_back(s);
  for (int b = 0; b < 256; ++b) sym_bytes.push_back(std::string(1, char(b)));

  // Words sorted for determinism (unordered_map iteration order is not).
  std::vector<std::pair<std::string, int64_t>> sorted(counts_.begin(), counts_.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::vector<int32_t>> words(sorted.size());
  std::vector<int64_t> freq(sorted.size());
  for (size_t w = 0; w < sorted.size(); ++w) {
    for (unsigned char b : sorted[w].first) words[w].push_back(n_special + b);
    freq[w] = sorted[w].second;
  }
  auto key = [](int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); };
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> pair_words;  // may hold stale or duplicate entries
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].size(); ++i) {
      uint64_t k = key(words[w][i], words[w][i + 1]);
      pair_count[k] += freq[w];
      pair_words[k].push_back(int32_t(w));
    }
  struct Entry {
    int64_t count;
    uint64_t pair;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : pair > o.pair; }
  };
  std::priority_queue<Entry> heap;
  for (auto& [k, c] : pair_count) heap.push({c, k});

  std::vector<std::pair<int32_t, int32_t>> merges;
  const int64_t target_merges = opts_.vocab_size - int64_t(sym_bytes.size());
  ProgressBar bar("bpe merges", target_merges, "merge");
  std::unordered_set<int32_t> touched;
  while (int64_t(merges.size()) < target_merges && !heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    auto pc = pair_count.find(e.pair);
    if (pc == pair_count.end() || pc->second != e.count) continue;  // stale
    if (e.count < opts_.min_frequency) break;
    const int32_t a = int32_t(e.pair >> 32), b = int32_t(e.pair & 0xffffffffu);
    const int32_t new_id = int32_t(sym_bytes.size());
    sym_bytes.push_back(sym_bytes[size_t(a)] + sym_bytes[size_t(b)]);
    merges.emplace_back(a, b);
    touched.clear();
    std::vector<int32_t> ws = std::move(pair_words[e.pair]);
    pair_words.erase(e.pair);
    std::vector<uint64_t> changed;
    for (int32_t w : ws) {
      if (!touched.insert(w).second) continue;
      auto& sy = words[size_t(w)];
      // Remove this word's old pair counts, merge, add the new ones.
      for (size_t i = 0; i + 1 < sy.size(); ++i) {
        uint64_t k = key(sy[i], sy[i + 1]);
        pair_count[k] -= freq[size_t(w)];
        changed.push_back(k);
      }
      std::vector<int32_t> merged;
      merged.reserve(sy.size());
      for (size_t i = 0; i < sy.size(); ++i) {
        if (i + 1 < sy.size() && sy[i] == a && sy[i + 1] == b) {
          merged.push_back(new_id);
          ++i;
        } else {
          merged.push_back(sy[i]);
        }
      }
      sy.swap(merged);
      for (size_t i = 0; i + 1 < sy.size(); ++i) {
        uint64_t k = key(sy[i], sy[i + 1]);
        pair_count[k] += freq[size_t(w)];
        changed.push_back(k);
        if (sy[i] == new_id || sy[i + 1] == new_id) pair_words[k].push_back(w);
      }
    }
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    for (uint64_t k : changed) {
      auto it = pair_count.find(k);
      if (it->second <= 0) pair_count.erase(it);
      else heap.push({it->second, k});
    }
    if (opts_.show_progress) bar.update(int64_t(merges.size()));
  }
  if (opts_.show_progress) bar.finish(fmt::format("{} merges", merges.size()));

  json vocab = json::object(), added = json::array(), jmerges = json::array();
  for (int32_t i = 0; i < n_special; ++i) {
    vocab[sym_bytes[size_t(i)]] = i;
    added.push_back({{"id", i}, {"content", sym_bytes[size_t(i)]}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  }
  for (size_t i = size_t(n_special); i < sym_bytes.size(); ++i) vocab[bl_string(sym_bytes[i])] = i;
  for (auto [a, b] : merges) jmerges.push_back(json::array({bl_string(sym_bytes[size_t(a)]), bl_string(sym_bytes[size_t(b)])}));
  json j = {{"version", "1.0"},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", opts_.pre_tokenizer},
            {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
            {"model",
             {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
              {"vocab", vocab}, {"merges", jmerges}}}};
  return Tokenizer::from_json(j, "trained tokenizer");
}

}  // namespace trex::data
