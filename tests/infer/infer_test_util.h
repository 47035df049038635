// Helpers shared by the inference tests: the golden DeepSeek-V4 fixtures (model + io tensors).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/files.h"
#include "infer/model_loader.h"

namespace trex::test {

// "tiny" lives in the shared fixtures; the extra ones beside the tests.
inline std::filesystem::path dsv4_fixture(const std::string& name) {
  if (name == "tiny") return shared_dir() / "fixtures" / "deepseek-v4" / "tiny";
  return source_dir() / "tests" / "fixtures" / "deepseek-v4" / name;
}

// An integer tensor of io.safetensors as int32 rows.
inline std::vector<std::vector<int32_t>> int_rows(const ckpt::SafetensorsReader& io,
                                                  const std::string& name) {
  const TensorView v = io.view(name);
  EXPECT_EQ(v.shape.size(), 2u) << name;
  const int64_t R = v.shape[0], C = v.shape[1];
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(R),
                                         std::vector<int32_t>(static_cast<size_t>(C)));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      rows[size_t(r)][size_t(c)] = v.dtype == DType::I64 ? int32_t(v.as<const int64_t>()[r * C + c])
                                                         : v.as<const int32_t>()[r * C + c];
  return rows;
}

// A fixture name as a gtest parameter name ("v4-tiny-b" -> "v4_tiny_b").
inline std::string fixture_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

// max |a - b| / max |b| over n values.
inline double rel_max_err(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::abs(double(a[i]) - double(b[i])));
    den = std::max(den, std::abs(double(b[i])));
  }
  return den > 0 ? num / den : num;
}

}  // namespace trex::test
