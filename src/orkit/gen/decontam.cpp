#include "orkit/gen/decontam.h"

#include <algorithm>
#include <cctype>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace trex::orkit::gen {

uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) {  // FNV-1a 64, then a final mix
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

std::vector<std::string> word_tokens(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (unsigned char c : text) {
    if (std::isalnum(c)) {
      cur += static_cast<char>(std::tolower(c));
    } else if (!cur.empty()) {
      out.push_back(std::move(cur));
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

namespace {
std::vector<uint64_t> ngram_hashes(const std::string& text, int n) {
  const auto tok = word_tokens(text);
  std::vector<uint64_t> out;
  if (tok.size() < static_cast<size_t>(n)) return out;
  for (size_t i = 0; i + n <= tok.size(); ++i) {
    std::string g;
    for (int k = 0; k < n; ++k) (g += tok[i + k]) += ' ';
    out.push_back(hash_bytes(g.data(), g.size()));
  }
  return out;
}
}  // namespace

void BenchmarkIndex::add_question(const std::string& benchmark, const std::string& id, const std::string& text) {
  auto it = std::find(benchmarks_.begin(), benchmarks_.end(), benchmark);
  uint32_t b = static_cast<uint32_t>(it - benchmarks_.begin());
  if (it == benchmarks_.end()) benchmarks_.push_back(benchmark);
  const uint32_t item = static_cast<uint32_t>(items_.size());
  items_.push_back({b, id});
  for (uint64_t h : ngram_hashes(text, n_)) grams_.emplace(h, item);
}

size_t BenchmarkIndex::add_file(const std::filesystem::path& path) {
  std::ifstream f(path);
  TREX_CHECK(f, "cannot open benchmark file {}", path.string());
  std::string line;
  size_t count = 0, lineno = 0;
  const std::string name = path.stem().string();
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      trex::fail("{}:{}: not a JSON object: {}", path.string(), lineno, e.what());
    }
    TREX_CHECK(j.contains("question") && j["question"].is_string(), "{}:{}: no string field \"question\"",
               path.string(), lineno);
    add_question(name, j.value("id", std::to_string(lineno)), j["question"].get<std::string>());
    ++count;
  }
  return count;
}

size_t BenchmarkIndex::add_dir(const std::filesystem::path& dir) {
  TREX_CHECK(std::filesystem::is_directory(dir), "benchmark directory {} does not exist", dir.string());
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".jsonl") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  size_t n = 0;
  for (const auto& p : files) n += add_file(p);
  return n;
}

Overlap BenchmarkIndex::score(const std::string& text) const {
  Overlap o;
  const auto hs = ngram_hashes(text, n_);
  if (hs.empty() || grams_.empty()) return o;
  size_t matched = 0;
  std::unordered_map<uint32_t, size_t> per_item;
  for (uint64_t h : hs) {
    auto it = grams_.find(h);
    if (it == grams_.end()) continue;
    ++matched;
    ++per_item[it->second];
  }
  o.containment = static_cast<double>(matched) / hs.size();
  size_t best = 0;
  uint32_t best_item = 0;
  for (auto [item, c] : per_item)
    if (c > best || (c == best && item < best_item)) best = c, best_item = item;
  if (best > 0) {
    o.benchmark = benchmarks_[items_[best_item].benchmark];
    o.item_id = items_[best_item].id;
  }
  return o;
}

}  // namespace trex::orkit::gen
