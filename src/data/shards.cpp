#include "data/shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"

namespace trex::data {

using json = nlohmann::json;
namespace fs = std::filesystem;

json PrepareStats::to_json() const {
  return {{"lines", lines},   {"documents", documents}, {"empty_skipped", empty_skipped},
          {"bad_skipped", bad_skipped}, {"split_documents", split_documents},
          {"truncated_chats", truncated_chats}, {"dropped_chats", dropped_chats}, {"longest_chat", longest_chat},
          {"rows", rows},
          {"tokens", tokens}, {"target_tokens", target_tokens}, {"pad_tokens", pad_tokens}};
}

LongChats parse_long_chats(const std::string& s, const std::string& where) {
  if (s == "truncate") return LongChats::Truncate;
  if (s == "drop") return LongChats::Drop;
  fail("{}: long_chats '{}' (expected truncate or drop)", where, s);
}

namespace {

class ShardWriter {
 public:
  ShardWriter(fs::path dir, int64_t seq, int64_t rows_per_shard, uint32_t pad_id)
      : dir_(std::move(dir)), seq_(seq), rows_per_shard_(rows_per_shard), pad_id_(pad_id) {}

  // Appends one chunk (<= seq tokens) as a document; starts a new row when it does not fit.
  void add_chunk(const int32_t* ids, const uint8_t* target, int64_t n, PrepareStats& st) {
    TREX_ASSERT(n > 0 && n <= seq_);
    if (int64_t(row_tokens_.size()) + n > seq_) flush_row(st);
    for (int64_t i = 0; i < n; ++i) {
      row_tokens_.push_back(uint32_t(ids[i]));
      uint8_t f = target[i] ? kTarget : 0;
      if (i == 0) f = kDocStart;  // nothing before it in its context: never a target
      row_flags_.push_back(f);
      st.target_tokens += (f & kTarget) ? 1 : 0;
    }
    st.tokens += n;
  }

  void finish(PrepareStats& st) {
    if (!row_tokens_.empty()) flush_row(st);
    if (!shard_tokens_.empty()) write_shard();
  }
  const json& shards() const { return shards_; }

 private:
  void flush_row(PrepareStats& st) {
    const int64_t pad = seq_ - int64_t(row_tokens_.size());
    for (int64_t i = 0; i < pad; ++i) {
      row_tokens_.push_back(pad_id_);
      row_flags_.push_back(uint8_t(kPad | (i == 0 ? kDocStart : 0)));
    }
    st.pad_tokens += pad;
    st.rows++;
    shard_tokens_.insert(shard_tokens_.end(), row_tokens_.begin(), row_tokens_.end());
    shard_flags_.insert(shard_flags_.end(), row_flags_.begin(), row_flags_.end());
    row_tokens_.clear();
    row_flags_.clear();
    if (int64_t(shard_tokens_.size()) >= rows_per_shard_ * seq_) write_shard();
  }

  void write_shard() {
    const std::string base = fmt::format("shard_{:05d}", shards_.size());
    const int64_t rows = int64_t(shard_tokens_.size()) / seq_;
    write_file_atomic(dir_ / (base + ".tokens"), [&](std::FILE* f) {
      TREX_CHECK(std::fwrite(shard_tokens_.data(), 4, shard_tokens_.size(), f) == shard_tokens_.size(),
                 "{}: short write", (dir_ / (base + ".tokens")).string());
    });
    write_file_atomic(dir_ / (base + ".flags"), [&](std::FILE* f) {
      TREX_CHECK(std::fwrite(shard_flags_.data(), 1, shard_flags_.size(), f) == shard_flags_.size(),
                 "{}: short write", (dir_ / (base + ".flags")).string());
    });
    shards_.push_back({{"tokens", base + ".tokens"}, {"flags", base + ".flags"}, {"rows", rows}});
    shard_tokens_.clear();
    shard_flags_.clear();
  }

  fs::path dir_;
  int64_t seq_, rows_per_shard_;
  uint32_t pad_id_;
  std::vector<uint32_t> row_tokens_, shard_tokens_;
  std::vector<uint8_t> row_flags_, shard_flags_;
  json shards_ = json::array();
};

}  // namespace

PrepareStats prepare_shards(const Tokenizer& tok, const std::vector<fs::path>& inputs, const fs::path& out_dir,
                            const PrepareOptions& opts) {
  TREX_CHECK(opts.seq_len >= 2, "data prepare: seq_len must be at least 2");
  TREX_CHECK(opts.format == "auto" || opts.format == "cpt" || opts.format == "sft",
             "data prepare: format '{}' (expected auto, cpt or sft)", opts.format);
  TREX_CHECK(!inputs.empty(), "data prepare: no input files");
  fs::create_directories(out_dir);
  const ChatTokens ct = ChatTokens::from(tok);
  PrepareStats st;
  ShardWriter writer(out_dir, opts.seq_len, opts.rows_per_shard, uint32_t(ct.eos));
  int64_t total_bytes = 0;
  for (const auto& in : inputs) {
    std::error_code ec;
    auto sz = fs::file_size(in, ec);
    TREX_CHECK(!ec, "{}: cannot read: {}", in.string(), ec.message());
    total_bytes += int64_t(sz);
  }
  ProgressBar bar("data prepare", total_bytes, "B");
  int64_t bytes_done = 0;
  for (const auto& in : inputs) {
    std::ifstream f(in);
    TREX_CHECK(f.good(), "{}: cannot open", in.string());
    std::string line;
    int64_t lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      ++st.lines;
      bytes_done += int64_t(line.size()) + 1;
      const std::string where = fmt::format("{}:{}", in.string(), lineno);
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        st.empty_skipped++;
        continue;
      }
      EncodedSample s;
      bool chat = false;
      try {
        json j;
        try {
          j = json::parse(line);
        } catch (const json::parse_error& e) {
          fail("{}: invalid JSON: {}", where, e.what());
        }
        TREX_CHECK(j.is_object(), "{}: expected a JSON object per line", where);
        const bool is_text = j.contains("text");
        chat = j.contains("messages");
        if (opts.format == "cpt") TREX_CHECK(is_text, "{}: CPT line without 'text'", where);
        if (opts.format == "sft") TREX_CHECK(chat, "{}: SFT line without 'messages'", where);
        TREX_CHECK(is_text != chat, "{}: expected exactly one of 'text' (CPT) or 'messages' (SFT)", where);
        if (is_text) {
          TREX_CHECK(j["text"].is_string(), "{}: 'text' must be a string", where);
          const std::string text = j["text"].get<std::string>();
          if (text.empty()) {
            st.empty_skipped++;
            continue;
          }
          s = encode_text(tok, text);
        } else {
          auto msgs = parse_messages(j["messages"], where);
          if (msgs.empty()) {
            st.empty_skipped++;
            continue;
          }
          try {
            s = encode_chat(tok, msgs, opts.thinking);
          } catch (const Error& e) {
            fail("{}: {}", where, e.what());
          }
        }
      } catch (const Error& e) {
        TREX_CHECK(opts.skip_bad_lines, "{} (use --skip-bad to skip malformed lines)", e.what());
        st.bad_skipped++;
        if (st.bad_examples.size() < 10) st.bad_examples.push_back(e.what());
        log::warn("skipping {}", e.what());
        continue;
      }
      st.documents++;
      int64_t n = int64_t(s.ids.size());
      if (chat && n > opts.seq_len) {
        st.longest_chat = std::max(st.longest_chat, n);
        // The row's first token is never a target (nothing before it in its context).
        const bool answer_left =
            std::any_of(s.target.begin() + 1, s.target.begin() + opts.seq_len, [](uint8_t t) { return t != 0; });
        if (opts.long_chats == LongChats::Drop || !answer_left) {
          st.dropped_chats++;
          continue;
        }
        st.truncated_chats++;
        n = opts.seq_len;
      } else if (n > opts.seq_len) {
        st.split_documents++;
      }
      for (int64_t off = 0; off < n; off += opts.seq_len) {
        const int64_t len = std::min(opts.seq_len, n - off);
        if (len < 2) break;  // a 1-token tail has nothing to predict
        writer.add_chunk(s.ids.data() + off, s.target.data() + off, len, st);
      }
      if (opts.show_progress) bar.update(std::min(bytes_done, total_bytes), fmt::format("{} docs", st.documents));
    }
  }
  writer.finish(st);
  if (opts.show_progress) bar.finish(fmt::format("{} docs, {} rows", st.documents, st.rows));
  if (st.truncated_chats + st.dropped_chats > 0)
    log::warn("data prepare: {} of {} documents are chats longer than seq_len {} (the longest {} tokens): {} kept "
              "truncated to their first {} tokens, {} dropped ({}); a larger data.seq_len trains on whole answers",
              st.truncated_chats + st.dropped_chats, st.documents, opts.seq_len, st.longest_chat, st.truncated_chats,
              opts.seq_len, st.dropped_chats,
              opts.long_chats == LongChats::Drop ? "long_chats: drop" : "no assistant token within seq_len");
  TREX_CHECK(st.rows > 0,
             "data prepare: no documents in the inputs ({} lines, {} empty, {} bad, {} chats longer than seq_len {} "
             "dropped)",
             st.lines, st.empty_skipped, st.bad_skipped, st.dropped_chats, opts.seq_len);
  json index = {{"format", "trex-shards-v1"}, {"seq_len", opts.seq_len}, {"rows", st.rows},
                {"vocab_size", tok.vocab_size()}, {"bos_id", ct.bos}, {"eos_id", ct.eos},
                {"shards", writer.shards()}, {"stats", st.to_json()}};
  json srcs = json::array();
  for (const auto& in : inputs) srcs.push_back(in.string());
  index["inputs"] = srcs;
  write_json_atomic(out_dir / "index.json", index);
  return st;
}

ShardDataset::ShardDataset(const fs::path& dir) {
  index_ = read_json_file(dir / "index.json");
  const std::string where = (dir / "index.json").string();
  TREX_CHECK(index_.value("format", "") == "trex-shards-v1", "{}: not a trex shard index", where);
  seq_len_ = index_.at("seq_len").get<int64_t>();
  for (const auto& s : index_.at("shards")) {
    Shard sh{MappedFile(dir / s.at("tokens").get<std::string>()), MappedFile(dir / s.at("flags").get<std::string>()),
             s.at("rows").get<int64_t>(), total_rows_};
    TREX_CHECK(int64_t(sh.tokens.size()) == sh.rows * seq_len_ * 4, "{}: {} bytes, expected {} rows x {} x 4",
               sh.tokens.path().string(), sh.tokens.size(), sh.rows, seq_len_);
    TREX_CHECK(int64_t(sh.flags.size()) == sh.rows * seq_len_, "{}: {} bytes, expected {} rows x {}",
               sh.flags.path().string(), sh.flags.size(), sh.rows, seq_len_);
    total_rows_ += sh.rows;
    shards_.push_back(std::move(sh));
  }
  TREX_CHECK(total_rows_ > 0, "{}: no rows", where);
}

const uint32_t* ShardDataset::tokens(int64_t row) const {
  TREX_CHECK(row >= 0 && row < total_rows_, "row {} out of range [0, {})", row, total_rows_);
  for (const auto& s : shards_)
    if (row < s.first_row + s.rows)
      return reinterpret_cast<const uint32_t*>(s.tokens.data()) + (row - s.first_row) * seq_len_;
  TREX_ASSERT(false);
}

const uint8_t* ShardDataset::flags(int64_t row) const {
  TREX_CHECK(row >= 0 && row < total_rows_, "row {} out of range [0, {})", row, total_rows_);
  for (const auto& s : shards_)
    if (row < s.first_row + s.rows) return s.flags.data() + (row - s.first_row) * seq_len_;
  TREX_ASSERT(false);
}

void make_batch(const ShardDataset& ds, const std::vector<int64_t>& rows, int32_t pad_id, Batch& b) {
  const int64_t S = ds.seq_len();
  b.batch = int64_t(rows.size());
  b.seq = S;
  const size_t n = size_t(b.batch * S);
  b.input_ids.resize(n);
  b.labels.resize(n);
  b.pos.resize(n);
  b.doc_start.resize(n);
  b.n_targets = 0;
  for (int64_t r = 0; r < b.batch; ++r) {
    const uint32_t* tk = ds.tokens(rows[size_t(r)]);
    const uint8_t* fl = ds.flags(rows[size_t(r)]);
    int32_t pos = 0;
    for (int64_t t = 0; t < S; ++t) {
      const size_t i = size_t(r * S + t);
      const bool start = (fl[t] & kDocStart) || t == 0;
      pos = start ? 0 : pos + 1;
      b.input_ids[i] = (fl[t] & kPad) ? pad_id : int32_t(tk[t]);
      b.pos[i] = pos;
      b.doc_start[i] = start ? 1 : 0;
      // batch.h: a target is a token the previous position of its document predicts.
      const bool target = !start && (fl[t] & kTarget) && !(fl[t] & kPad);
      b.labels[i] = target ? int32_t(tk[t]) : -1;
      b.n_targets += target;
    }
  }
}

}  // namespace trex::data
