// Benchmark decontamination: word n-gram overlap of a generated question against every question of the
// benchmarks in <shared>/benchmarks/*.jsonl. The score is the containment: the fraction of the question's
// n-grams that occur in some benchmark question; samples at or above the threshold are dropped.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <unordered_map>
#include <vector>

namespace trex::orkit::gen {

std::vector<std::string> word_tokens(const std::string& text);  // lowercase alphanumeric runs

struct Overlap {
  double containment = 0.0;   // matched n-grams / n-grams of the question
  std::string benchmark;      // benchmark of the most-overlapping item ("" when none)
  std::string item_id;
};

class BenchmarkIndex {
 public:
  explicit BenchmarkIndex(int n = 8) : n_(n) {}
  // Adds every line's "question" of a benchmark JSONL file; returns the number of questions.
  size_t add_file(const std::filesystem::path& path);
  // Adds all *.jsonl under `dir` (sorted by name); returns the number of questions.
  size_t add_dir(const std::filesystem::path& dir);
  void add_question(const std::string& benchmark, const std::string& id, const std::string& text);
  Overlap score(const std::string& text) const;
  size_t questions() const { return items_.size(); }
  const std::vector<std::string>& benchmarks() const { return benchmarks_; }
  int n() const { return n_; }

 private:
  int n_;
  std::unordered_map<uint64_t, uint32_t> grams_;  // n-gram hash -> first item holding it
  struct Item {
    uint32_t benchmark;
    std::string id;
  };
  std::vector<Item> items_;
  std::vector<std::string> benchmarks_;
};

uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 0);

}  // namespace trex::orkit::gen
