#include "orkit/eval/cache.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

#include "core/error.h"
#include "core/log.h"

namespace trex::orkit::eval {

using nlohmann::json;

ResponseCache::ResponseCache(std::filesystem::path path) : path_(std::move(path)) {
  std::ifstream in(path_);
  std::string line;
  int lineno = 0, bad = 0;
  while (std::getline(in, line)) {
    ++lineno;
    try {
      json j = json::parse(line);
      if (j.is_object() && j.contains("key")) entries_[j["key"].get<std::string>()] = j;
    } catch (const std::exception&) {
      ++bad;  // a torn line from an interrupted run
    }
  }
  (void)bad;
  file_ = std::fopen(path_.c_str(), "a");
  TREX_CHECK(file_ != nullptr, "cannot open the response cache {} for appending", path_.string());
}

ResponseCache::~ResponseCache() {
  if (file_) std::fclose(file_);
}

std::string ResponseCache::key(const std::string& item_id, const std::string& model, const json& messages,
                               const json& sampling) {
  const std::string s =
      json{{"id", item_id}, {"model", model}, {"messages", messages}, {"sampling", sampling}}.dump(
          -1, ' ', false, json::error_handler_t::replace);
  uint64_t h1 = 1469598103934665603ull, h2 = 0x9e3779b97f4a7c15ull;
  for (unsigned char c : s) {
    h1 = (h1 ^ c) * 1099511628211ull;
    h2 = (h2 ^ c) * 0x100000001b3ull + 0x7f4a7c15ull;
  }
  return fmt::format("{:016x}{:016x}", h1, h2);
}

std::optional<json> ResponseCache::get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

void ResponseCache::put(const std::string& key, const json& entry) {
  json e = entry;
  e["key"] = key;
  const std::string line = e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  entries_[key] = e;
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
  fsync(fileno(file_));
}

size_t ResponseCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace trex::orkit::eval
