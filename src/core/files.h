// File helpers with the project's guarantees: reads name the file in every error; writes go to a
// temporary name in the same directory, are flushed to disk, then renamed over the target, so a
// crash leaves either the old file or the new one, never half of one.
#pragma once
#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace trex {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_text_file(const fs::path& path);
json read_json_file(const fs::path& path);  // parse errors name the file, line and column

// Writes via `path.tmp-<pid>`, fsync, rename. `write` receives the open FILE*.
void write_file_atomic(const fs::path& path, const std::function<void(std::FILE*)>& write);
void write_text_atomic(const fs::path& path, std::string_view text);
void write_json_atomic(const fs::path& path, const json& j, int indent = 1);
void fsync_dir(const fs::path& dir);

// Read-only memory map of a whole file.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const fs::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Directory holding the shared fixtures/bench/benchmarks: $TREX_SHARED, else the build-time default.
fs::path shared_dir();
fs::path source_dir();

}  // namespace trex
