// Responses cached by (item, model, prompt, sampling settings), so an interrupted `trex eval run` resumes
// where it stopped. An append-only JSONL file: one line per finished request, flushed and fsync'ed as it
// is written; a torn last line (a crash mid-write) is ignored on load.
#pragma once
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>

namespace trex::orkit::eval {

class ResponseCache {
 public:
  explicit ResponseCache(std::filesystem::path path);
  ~ResponseCache();
  ResponseCache(const ResponseCache&) = delete;
  ResponseCache& operator=(const ResponseCache&) = delete;

  // A stable key: 128-bit FNV-1a over the canonical JSON of the request identity.
  static std::string key(const std::string& item_id, const std::string& model, const nlohmann::json& messages,
                         const nlohmann::json& sampling);
  std::optional<nlohmann::json> get(const std::string& key) const;
  void put(const std::string& key, const nlohmann::json& entry);  // entry: response, usage, ...
  size_t size() const;

 private:
  std::filesystem::path path_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, nlohmann::json> entries_;
  std::FILE* file_ = nullptr;
};

}  // namespace trex::orkit::eval
