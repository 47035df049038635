#include "orkit/gen/corpus.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "orkit/gen/decontam.h"
#include "orkit/gen/rng.h"

namespace trex::orkit::gen {

std::string normalize_text(const std::string& in) {
  std::string s;
  s.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    unsigned char c = in[i];
    if (c == '\r') {
      if (i + 1 < in.size() && in[i + 1] == '\n') continue;
      c = '\n';
    }
    if (c == '\t' || c == '\v' || c == '\f') c = ' ';
    if (c < 0x20 && c != '\n') continue;
    if (c == 0x7f) continue;
    // U+00A0 (no-break space, C2 A0) -> ' '
    if (c == 0xC2 && i + 1 < in.size() && static_cast<unsigned char>(in[i + 1]) == 0xA0) {
      ++i;
      c = ' ';
    }
    s += static_cast<char>(c);
  }
  std::string out;
  size_t blank_run = 0;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t nl = s.find('\n', pos);
    if (nl == std::string::npos) nl = s.size();
    // Leading spaces are kept (code and Markdown indentation); interior runs collapse to one.
    std::string line;
    size_t i = pos;
    while (i < nl && s[i] == ' ') line += s[i++];
    for (; i < nl; ++i)
      if (!(s[i] == ' ' && line.size() > 0 && line.back() == ' ')) line += s[i];
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (line.empty() || line.find_first_not_of(' ') == std::string::npos) {
      ++blank_run;
      if (blank_run == 1 && !out.empty()) out += '\n';
    } else {
      blank_run = 0;
      out += line + '\n';
    }
    pos = nl + 1;
  }
  while (!out.empty() && (out.back() == '\n')) out.pop_back();
  return out.find_first_not_of("\n ") == std::string::npos ? "" : out;
}

std::string quality_reject_reason(const std::string& text, const QualityOptions& o) {
  if (text.size() < o.min_chars) return "too_short";
  if (text.size() > o.max_chars) return "too_long";
  size_t letters = 0, nonspace = 0;
  for (unsigned char c : text) {
    if (std::isspace(c)) continue;
    ++nonspace;
    if (std::isalpha(c) || c >= 0x80) ++letters;
  }
  if (nonspace == 0 || static_cast<double>(letters) / nonspace < o.min_alpha_ratio) return "low_alpha_ratio";
  const auto words = word_tokens(text);
  size_t wchars = 0;
  for (const auto& w : words) wchars += w.size();
  const double mean = words.empty() ? 0 : static_cast<double>(wchars) / words.size();
  if (mean < o.min_mean_word || mean > o.max_mean_word) return "odd_word_length";
  std::unordered_map<std::string, int> lines;
  size_t nonempty = 0, dups = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    if (line.find_first_not_of(" `#-|") != std::string::npos) {
      ++nonempty;
      if (lines[line]++ > 0) ++dups;
    }
    pos = nl + 1;
  }
  if (nonempty > 0 && static_cast<double>(dups) / nonempty > o.max_dup_line_ratio) return "repeated_lines";
  std::string lower = text.substr(0, 2000);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower.find("lorem ipsum") != std::string::npos) return "boilerplate";
  return "";
}

std::vector<std::string> read_documents(const std::filesystem::path& path, size_t chunk_chars) {
  std::vector<std::string> docs;
  const std::string ext = path.extension().string();
  if (ext == ".jsonl") {
    std::ifstream f(path);
    TREX_CHECK(f, "cannot open {}", path.string());
    std::string line;
    size_t lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        trex::fail("{}:{}: invalid JSON: {}", path.string(), lineno, e.what());
      }
      TREX_CHECK(j.is_object() && j.contains("text") && j["text"].is_string(),
                 "{}:{}: expected an object with a string field \"text\"", path.string(), lineno);
      docs.push_back(j["text"].get<std::string>());
    }
    return docs;
  }
  TREX_CHECK(ext == ".txt" || ext == ".md" || ext == ".markdown",
             "{}: unsupported file type '{}' (expected .txt, .md or .jsonl)", path.string(), ext);
  const std::string text = read_text_file(path);
  std::string cur;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n\n", pos);
    if (end == std::string::npos) end = text.size();
    std::string para = text.substr(pos, end - pos);
    if (!cur.empty() && cur.size() + para.size() + 2 > chunk_chars) {
      docs.push_back(cur);
      cur.clear();
    }
    cur += (cur.empty() ? "" : "\n\n") + para;
    pos = end + 2;
  }
  if (cur.find_first_not_of(" \n") != std::string::npos) docs.push_back(cur);
  return docs;
}

MinHasher::MinHasher(int num_perm, int shingle_words, uint64_t seed) : num_perm_(num_perm), shingle_(shingle_words) {
  Rng rng(seed);
  for (int i = 0; i < num_perm; ++i) {
    a_.push_back(rng.next() | 1);
    b_.push_back(rng.next());
  }
}

std::vector<uint64_t> MinHasher::signature(const std::string& text) const {
  std::vector<uint64_t> sig(num_perm_, std::numeric_limits<uint64_t>::max());
  const auto tok = word_tokens(text);
  const size_t k = static_cast<size_t>(shingle_);
  const size_t count = tok.size() >= k ? tok.size() - k + 1 : (tok.empty() ? 0 : 1);
  for (size_t i = 0; i < count; ++i) {
    std::string g;
    for (size_t j = i; j < std::min(tok.size(), i + k); ++j) (g += tok[j]) += ' ';
    const uint64_t h = hash_bytes(g.data(), g.size());
    for (int p = 0; p < num_perm_; ++p) sig[p] = std::min(sig[p], splitmix64(h * a_[p] + b_[p]));
  }
  return sig;
}

double MinHasher::estimate(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b) {
  if (a.empty() || a.size() != b.size()) return 0.0;
  size_t eq = 0;
  for (size_t i = 0; i < a.size(); ++i) eq += a[i] == b[i];
  return static_cast<double>(eq) / a.size();
}

std::vector<bool> near_duplicate_filter(const std::vector<std::string>& docs, double threshold, int bands,
                                        size_t* dropped) {
  MinHasher mh;
  const int rows = mh.num_perm() / bands;
  std::vector<std::vector<uint64_t>> sigs(docs.size());
  std::vector<bool> keep(docs.size(), true);
  std::vector<std::unordered_map<uint64_t, std::vector<size_t>>> buckets(bands);
  size_t n_dropped = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    sigs[i] = mh.signature(docs[i]);
    std::vector<uint64_t> keys(bands);
    for (int b = 0; b < bands; ++b) keys[b] = hash_bytes(&sigs[i][b * rows], rows * sizeof(uint64_t), b);
    std::set<size_t> cands;
    for (int b = 0; b < bands; ++b) {
      auto it = buckets[b].find(keys[b]);
      if (it != buckets[b].end()) cands.insert(it->second.begin(), it->second.end());
    }
    for (size_t c : cands)
      if (MinHasher::estimate(sigs[i], sigs[c]) >= threshold) {
        keep[i] = false;
        break;
      }
    if (!keep[i]) {
      ++n_dropped;
      continue;
    }
    for (int b = 0; b < bands; ++b) buckets[b][keys[b]].push_back(i);
  }
  if (dropped) *dropped = n_dropped;
  return keep;
}

std::vector<std::string> clean_corpus(const std::vector<std::string>& docs, CorpusStats& st, const QualityOptions& q,
                                      double near_threshold) {
  st.input += docs.size();
  std::vector<std::string> passed;
  std::unordered_set<uint64_t> seen;
  for (const auto& d : docs) {
    std::string t = normalize_text(d);
    const std::string why = quality_reject_reason(t, q);
    if (!why.empty()) {
      ++st.quality_rejects[why];
      continue;
    }
    if (!seen.insert(hash_bytes(t.data(), t.size())).second) {
      ++st.exact_duplicates;
      continue;
    }
    passed.push_back(std::move(t));
  }
  size_t dropped = 0;
  const auto keep = near_duplicate_filter(passed, near_threshold, 32, &dropped);
  st.near_duplicates += dropped;
  std::vector<std::string> out;
  for (size_t i = 0; i < passed.size(); ++i)
    if (keep[i]) out.push_back(std::move(passed[i]));
  st.kept += out.size();
  return out;
}

}  // namespace trex::orkit::gen
