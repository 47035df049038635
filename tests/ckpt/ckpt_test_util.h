// Helpers shared by the ckpt tests: a scratch directory per test and raw-byte file writers.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/files.h"

namespace trex::test {

// A fresh, empty directory removed at the end of the test.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("trex-ckpt-" + std::to_string(::getpid()) + "-" +
                                         (info ? std::string(info->name()) : "x") + "-" + tag);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

inline void write_bytes(const fs::path& p, const std::string& bytes) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

// A safetensors file from a raw header text and `data_bytes` zero bytes of data; `declared_len`
// overrides the length prefix (-1: the real header length).
inline std::string raw_safetensors(const std::string& header, size_t data_bytes, int64_t declared_len = -1) {
  uint64_t n = declared_len < 0 ? header.size() : uint64_t(declared_len);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  out += header;
  out.append(data_bytes, '\0');
  return out;
}

// Runs `fn`, expects a trex::Error whose message contains every string in `parts`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected trex::Error mentioning '" << (parts.empty() ? "" : parts[0]) << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks '" << p << "': " << msg;
  }
}

inline fs::path fixture_dir() {
  return shared_dir() / "fixtures" / "deepseek-v4" / "tiny";
}

}  // namespace trex::test
