#include "data/tokenizer.h"

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "core/files.h"
#include "data/pre_tokenizer.h"
#include "data/unicode.h"

namespace trex::data {

using json = nlohmann::json;

namespace {
struct ByteLevelTables {
  char32_t to_cp[256];
  std::unordered_map<char32_t, int> from_cp;
  ByteLevelTables() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? char32_t(b) : char32_t(256 + n++);
      from_cp[to_cp[b]] = b;
    }
  }
};
const ByteLevelTables& bl() {
  static const ByteLevelTables t;
  return t;
}
// Token ids are int32 in the model and in every id list; the tables here are sized by the largest one, so an
// id is checked before it is narrowed (2^32 + 7 must not become 7) or used as a size.
constexpr int64_t kMaxTokenId = (int64_t(1) << 24) - 1;  // 16.7M: far above any real vocabulary

int32_t checked_token_id(const json& v, const std::string& where, const std::string& what) {
  TREX_CHECK(v.is_number_integer(), "{}: {} has id {}, expected an integer", where, what, v.dump());
  TREX_CHECK(!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(kMaxTokenId),
             "{}: {} has id {}, expected an integer in [0, {}]", where, what, v.dump(), kMaxTokenId);
  const int64_t id = v.get<int64_t>();
  TREX_CHECK(id >= 0 && id <= kMaxTokenId, "{}: {} has id {}, expected an integer in [0, {}]", where, what, id,
             kMaxTokenId);
  return int32_t(id);
}

}  // namespace

char32_t byte_level_char(uint8_t b) { return bl().to_cp[b]; }
int byte_level_byte(char32_t cp) {
  auto it = bl().from_cp.find(cp);
  return it == bl().from_cp.end() ? -1 : it->second;
}

// Vocab string (byte-level alphabet) -> raw bytes; false when a character is outside the alphabet.
static bool byte_level_decode(const std::string& token, std::string& bytes) {
  std::vector<char32_t> cps;
  std::vector<uint32_t> offs;
  unicode::decode_utf8(token, cps, offs);
  bytes.clear();
  for (char32_t c : cps) {
    int b = byte_level_byte(c);
    if (b < 0) return false;
    bytes.push_back(char(b));
  }
  return true;
}

Tokenizer::Tokenizer() { std::fill(std::begin(byte_id_), std::end(byte_id_), -1); }
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(const Tokenizer&) = default;
Tokenizer& Tokenizer::operator=(const Tokenizer&) = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  return from_json(read_json_file(path), path.string());
}

Tokenizer Tokenizer::from_json(const json& j, const std::string& where) {
  Tokenizer t;
  t.source_ = where;
  try {
    TREX_CHECK(j.is_object() && j.contains("model"), "{}: not a tokenizer.json (no 'model')", where);
    const json& norm = j.value("normalizer", json());
    bool trivial_norm = norm.is_null() || (norm.value("type", "") == "Sequence" && norm.value("normalizers", json::array()).empty());
    TREX_CHECK(trivial_norm, "{}: normalizer '{}' is not supported (byte-level BPE files have none)", where,
               norm.value("type", "?"));
    t.pre_tokenizer_json_ = j.value("pre_tokenizer", json());
    t.decoder_json_ = j.value("decoder", json());
    t.post_processor_json_ = j.value("post_processor", json());
    t.pre_ = PreTokenizer::from_json(t.pre_tokenizer_json_, where);
    TREX_CHECK(t.pre_->byte_level(), "{}: only byte-level BPE tokenizers are supported (no ByteLevel pre_tokenizer)",
               where);
    const json& m = j["model"];
    TREX_CHECK(m.value("type", "BPE") == "BPE", "{}: model type '{}' is not BPE", where, m.value("type", ""));
    TREX_CHECK(!m.value("byte_fallback", false), "{}: byte_fallback BPE (sentencepiece style) is not supported", where);
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
      TREX_CHECK(!m.contains(k) || m[k].is_null() || m[k] == "", "{}: model.{} is not supported", where, k);
    t.ignore_merges_ = m.value("ignore_merges", false);
    const json& vocab = m.at("vocab");
    TREX_CHECK(vocab.is_object(), "{}: model.vocab must be an object", where);
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it)
      max_id = std::max<int64_t>(max_id, checked_token_id(*it, where, "vocab entry '" + it.key() + "'"));
    std::vector<AddedToken> added;
    for (const auto& a : j.value("added_tokens", json::array())) {
      AddedToken at;
      at.content = a.at("content").get<std::string>();
      at.id = checked_token_id(a.at("id"), where, "added token '" + at.content + "'");
      at.special = a.value("special", false);
      at.lstrip = a.value("lstrip", false);
      at.rstrip = a.value("rstrip", false);
      at.single_word = a.value("single_word", false);
      at.normalized = a.value("normalized", false);
      TREX_CHECK(at.id >= 0 && !at.content.empty(), "{}: added token with bad id {} or empty content", where, at.id);
      max_id = std::max<int64_t>(max_id, at.id);
      added.push_back(at);
    }
    t.id_token_.assign(size_t(max_id + 1), "");
    t.id_bytes_.assign(size_t(max_id + 1), "");
    t.special_.assign(size_t(max_id + 1), 0);
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int32_t id = it->get<int32_t>();  // checked above
      t.id_token_[size_t(id)] = it.key();
      t.token_id_[it.key()] = id;
      std::string bytes;
      if (byte_level_decode(it.key(), bytes)) t.id_bytes_[size_t(id)] = bytes;
      else t.id_bytes_[size_t(id)] = it.key();  // e.g. special tokens listed in the vocab: their own text
    }
    for (const auto& at : added) {
      t.id_token_[size_t(at.id)] = at.content;
      t.id_bytes_[size_t(at.id)] = at.content;
      t.special_[size_t(at.id)] = at.special ? 1 : 0;
      t.token_id_[at.content] = at.id;
    }
    t.added_ = std::move(added);
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = t.token_id_.find(m["unk_token"].get<std::string>());
      TREX_CHECK(it != t.token_id_.end(), "{}: unk_token not in vocab", where);
      t.unk_id_ = it->second;
    }
    size_t rank = 0;
    for (const auto& mj : m.value("merges", json::array())) {
      std::string a, b;
      if (mj.is_string()) {
        const std::string s = mj.get<std::string>();
        auto sp = s.find(' ');
        TREX_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                   "{}: merge {} '{}' is not 'left right'", where, rank, s);
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else {
        TREX_CHECK(mj.is_array() && mj.size() == 2, "{}: merge {} is neither a string nor a pair", where, rank);
        a = mj[0].get<std::string>(), b = mj[1].get<std::string>();
      }
      auto ia = t.token_id_.find(a), ib = t.token_id_.find(b), iab = t.token_id_.find(a + b);
      TREX_CHECK(ia != t.token_id_.end() && ib != t.token_id_.end() && iab != t.token_id_.end(),
                 "{}: merge {} '{} {}' uses a token missing from the vocab", where, rank, a, b);
      t.merges_.emplace_back(ia->second, ib->second);
      uint64_t key = (uint64_t(uint32_t(ia->second)) << 32) | uint32_t(ib->second);
      t.merge_rank_.emplace(key, std::make_pair(int32_t(rank), iab->second));  // first occurrence wins
      ++rank;
    }
  } catch (const json::exception& e) {
    fail("{}: malformed tokenizer.json: {}", where, e.what());
  }
  t.build_indexes(where);
  return t;
}

void Tokenizer::build_indexes(const std::string& where) {
  for (int b = 0; b < 256; ++b) {
    std::string s;
    unicode::append_utf8(s, byte_level_char(uint8_t(b)));
    auto it = token_id_.find(s);
    byte_id_[b] = it == token_id_.end() ? -1 : it->second;
  }
  added_by_first_byte_.assign(256, {});
  for (size_t i = 0; i < added_.size(); ++i)
    added_by_first_byte_[uint8_t(added_[i].content[0])].push_back(int32_t(i));
  for (auto& v : added_by_first_byte_)
    std::stable_sort(v.begin(), v.end(), [&](int32_t a, int32_t b) {
      return added_[size_t(a)].content.size() > added_[size_t(b)].content.size();
    });
  cache_.clear();
}

json Tokenizer::to_json() const {
  json added = json::array();
  for (const auto& a : added_)
    added.push_back({{"id", a.id}, {"content", a.content}, {"single_word", a.single_word}, {"lstrip", a.lstrip},
                     {"rstrip", a.rstrip}, {"normalized", a.normalized}, {"special", a.special}});
  json vocab = json::object();
  for (size_t id = 0; id < id_token_.size(); ++id)
    if (!id_token_[id].empty()) vocab[id_token_[id]] = id;
  json merges = json::array();
  for (auto [a, b] : merges_) merges.push_back(json::array({id_token_[size_t(a)], id_token_[size_t(b)]}));
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer", pre_tokenizer_json_},
              {"post_processor", post_processor_json_},
              {"decoder", decoder_json_},
              {"model",
               {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", unk_id_ >= 0 ? json(id_token_[size_t(unk_id_)]) : json()},
                {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", ignore_merges_}, {"vocab", vocab}, {"merges", merges}}}};
}

void Tokenizer::save(const std::filesystem::path& path) const { write_json_atomic(path, to_json(), -1); }

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto it = token_id_.find(std::string(token));
  return it == token_id_.end() ? -1 : it->second;
}

int32_t Tokenizer::special_id(std::string_view content) const {
  int32_t id = token_to_id(content);
  TREX_CHECK(id >= 0, "{}: tokenizer has no token '{}'", source_, content);
  return id;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  TREX_CHECK(id >= 0 && size_t(id) < id_token_.size(), "token id {} out of range [0, {})", id, id_token_.size());
  return id_token_[size_t(id)];
}

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && size_t(id) < special_.size() && special_[size_t(id)]; }

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  pre_->split(text, pieces);
  return pieces;
}

void Tokenizer::bpe_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = token_id_.find(std::string(piece));
    if (it != token_id_.end() && !special_[size_t(it->second)]) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = piece.size() <= 64;
  if (cacheable) {
    auto it = cache_.find(std::string(piece));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  // Symbols in a linked list; a heap of candidate merges ordered by (rank, position) as Hugging Face's
  // BPE does: the lowest-ranked pair merges first, leftmost among equals.
  struct Sym {
    int32_t id;
    int32_t prev, next;
  };
  const int32_t n = int32_t(piece.size());
  std::vector<Sym> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    int32_t id = byte_id_[uint8_t(piece[size_t(i)])];
    if (id < 0) {
      TREX_CHECK(unk_id_ >= 0, "{}: vocab has no token for byte 0x{:02X} and no unk_token", source_,
                 unsigned(uint8_t(piece[size_t(i)])));
      id = unk_id_;
    }
    sym[size_t(i)] = {id, i - 1, i + 1 < n ? i + 1 : -1};
  }
  struct Cand {
    int32_t rank, pos, left, right;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    int32_t nx = sym[size_t(pos)].next;
    if (nx < 0) return;
    uint64_t key = (uint64_t(uint32_t(sym[size_t(pos)].id)) << 32) | uint32_t(sym[size_t(nx)].id);
    auto it = merge_rank_.find(key);
    if (it != merge_rank_.end()) heap.push({it->second.first, pos, sym[size_t(pos)].id, sym[size_t(nx)].id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& l = sym[size_t(c.pos)];
    if (l.id != c.left || l.next < 0 || sym[size_t(l.next)].id != c.right) continue;  // stale
    uint64_t key = (uint64_t(uint32_t(c.left)) << 32) | uint32_t(c.right);
    l.id = merge_rank_.at(key).second;
    int32_t r = l.next;
    l.next = sym[size_t(r)].next;
    if (l.next >= 0) sym[size_t(l.next)].prev = c.pos;
    sym[size_t(r)].id = -1;
    consider(l.prev);
    consider(c.pos);
  }
  size_t start = out.size();
  for (int32_t i = 0; i >= 0; i = sym[size_t(i)].next) out.push_back(sym[size_t(i)].id);
  if (cacheable) {
    if (cache_.size() > 200000) cache_.clear();
    cache_.emplace(std::string(piece), std::vector<int32_t>(out.begin() + long(start), out.end()));
  }
}

void Tokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<std::string> pieces;
  pre_->split(text, pieces);
  for (const auto& p : pieces) bpe_piece(p, out);
}

static bool is_word_byte(unsigned char c) { return std::isalnum(c) || c == '_' || c >= 0x80; }
static bool is_space_byte(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out, bool allow_special) const {
  if (added_.empty()) {
    encode_segment(text, out);
    return;
  }
  size_t seg_start = 0, i = 0;
  while (i < text.size()) {
    const auto& cands = added_by_first_byte_[uint8_t(text[i])];
    const AddedToken* hit = nullptr;
    for (int32_t ci : cands) {
      const AddedToken& a = added_[size_t(ci)];
      if (a.special && !allow_special) continue;
      if (text.compare(i, a.content.size(), a.content) != 0) continue;
      if (a.single_word) {
        bool left_ok = i == 0 || !is_word_byte(uint8_t(text[i - 1]));
        size_t e = i + a.content.size();
        bool right_ok = e >= text.size() || !is_word_byte(uint8_t(text[e]));
        if (!left_ok || !right_ok) continue;
      }
      hit = &a;
      break;
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t tok_begin = i, tok_end = i + hit->content.size();
    if (hit->lstrip)
      while (tok_begin > seg_start && is_space_byte(uint8_t(text[tok_begin - 1]))) --tok_begin;
    if (hit->rstrip)
      while (tok_end < text.size() && is_space_byte(uint8_t(text[tok_end]))) ++tok_end;
    encode_segment(text.substr(seg_start, tok_begin - seg_start), out);
    out.push_back(hit->id);
    seg_start = i = tok_end;
  }
  encode_segment(text.substr(seg_start), out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  encode_append(text, out, allow_special);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string s;
  for (int32_t id : ids) {
    TREX_CHECK(id >= 0 && size_t(id) < id_bytes_.size(), "decode: token id {} out of range [0, {})", id,
               id_bytes_.size());
    if (skip_special && special_[size_t(id)]) continue;
    s += id_bytes_[size_t(id)];
  }
  return s;
}

}  // namespace trex::data
