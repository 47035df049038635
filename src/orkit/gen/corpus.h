// CPT corpus hygiene: text normalisation, ingestion of user-supplied domain text (plain text, Markdown,
// JSONL with a "text" field), quality filters, exact and near-duplicate removal (MinHash + LSH).
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace trex::orkit::gen {

// CRLF -> LF, tabs and odd spaces -> ' ', control characters dropped, trailing spaces trimmed, runs of
// spaces collapsed, at most one blank line in a row, leading/trailing blank lines removed.
std::string normalize_text(const std::string& text);

// "" when the document passes, else the filter that rejected it.
struct QualityOptions {
  size_t min_chars = 200;
  size_t max_chars = 200000;
  double min_alpha_ratio = 0.55;     // letters / non-space characters
  double max_dup_line_ratio = 0.3;   // repeated non-empty lines / non-empty lines
  double min_mean_word = 2.5, max_mean_word = 12.0;
};
std::string quality_reject_reason(const std::string& text, const QualityOptions& opts = {});

// Reads documents: .jsonl -> one per line ("text" field); .txt/.md -> the file, split at blank lines into
// chunks of at most `chunk_chars` characters. Errors name the file and line.
std::vector<std::string> read_documents(const std::filesystem::path& path, size_t chunk_chars = 6000);

class MinHasher {
 public:
  MinHasher(int num_perm = 128, int shingle_words = 5, uint64_t seed = 1);
  std::vector<uint64_t> signature(const std::string& text) const;
  static double estimate(const std::vector<uint64_t>& a, const std::vector<uint64_t>& b);
  int num_perm() const { return num_perm_; }

 private:
  int num_perm_, shingle_;
  std::vector<uint64_t> a_, b_;
};

// Marks near-duplicates: a document is dropped when an earlier kept one has estimated Jaccard >= threshold
// (LSH with `bands` bands proposes candidates, the signature estimate confirms). Returns keep flags.
std::vector<bool> near_duplicate_filter(const std::vector<std::string>& docs, double threshold = 0.8,
                                        int bands = 32, size_t* dropped = nullptr);

struct CorpusStats {
  size_t input = 0, kept = 0, exact_duplicates = 0, near_duplicates = 0;
  std::map<std::string, size_t> quality_rejects;
};
// Normalise, filter, exact-dedup and near-dedup a list of documents (order kept).
std::vector<std::string> clean_corpus(const std::vector<std::string>& docs, CorpusStats& stats,
                                      const QualityOptions& q = {}, double near_threshold = 0.8);

}  // namespace trex::orkit::gen
