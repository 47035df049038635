#include "core/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace trex {

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TREX_CHECK(in.good(), "{}: cannot open for reading: {}", path.string(), std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_json_file(const fs::path& path) {
  std::string text = read_text_file(path);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    // Translate the byte offset into line:column for the message.
    size_t line = 1, col = 1;
    for (size_t i = 0; i < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    fail("{}:{}:{}: invalid JSON: {}", path.string(), line, col, e.what());
  }
}

void fsync_dir(const fs::path& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void write_file_atomic(const fs::path& path, const std::function<void(std::FILE*)>& write) {
  fs::path dir = path.parent_path();
  if (!dir.empty()) fs::create_directories(dir);
  fs::path tmp = path;
  tmp += ".tmp-" + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TREX_CHECK(f != nullptr, "{}: cannot open for writing: {}", tmp.string(), std::strerror(errno));
  try {
    write(f);
  } catch (...) {
    std::fclose(f);
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::error_code ec;
    fs::remove(tmp, ec);
    fail("{}: write failed: {}", path.string(), std::strerror(errno));
  }
  fs::rename(tmp, path);
  fsync_dir(dir);
}

void write_text_atomic(const fs::path& path, std::string_view text) {
  write_file_atomic(path, [&](std::FILE* f) {
    TREX_CHECK(std::fwrite(text.data(), 1, text.size(), f) == text.size(), "{}: short write",
               path.string());
  });
}

void write_json_atomic(const fs::path& path, const json& j, int indent) {
  write_text_atomic(path, j.dump(indent) + "\n");
}

MappedFile::MappedFile(const fs::path& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  TREX_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("{}: cannot stat: {}", path.string(), std::strerror(errno));
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    TREX_CHECK(p != MAP_FAILED, "{}: mmap failed: {}", path.string(), std::strerror(errno));
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

fs::path shared_dir() {
  if (const char* env = std::getenv("TREX_SHARED")) return env;
  return TREX_SHARED_DIR;
}

fs::path source_dir() { return TREX_SOURCE_DIR; }

}  // namespace trex
