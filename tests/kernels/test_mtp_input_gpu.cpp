// The MTP input's embedding-row backward (kernels/cuda/mtp_input.h) against a host sum in token order: repeated ids
// (each table row gets several tokens), "no next token" rows (-1) that add nothing, rows the batch never names that
// stay as they were; and bitwise the same result on a second run (no atomics).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/cuda/mtp_input.h"

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;

TEST(GpuMtpInput, EmbeddingRowBackwardSumsRepeatedIdsInTokenOrder) {
  const int64_t n = 700, d = 300, V = 23;
  std::vector<int32_t> ids(n);
  for (int64_t t = 0; t < n; ++t) ids[t] = t % 11 == 5 ? -1 : int32_t((t * 7 + t / 13) % (V - 3));  // 3 rows unused
  const Bf16Data drows = random_bf16(size_t(n * d), 7);
  const std::vector<float> table0 = random_f32(size_t(V * d), 8);
  std::vector<float> want = table0;
  for (int64_t t = 0; t < n; ++t)
    if (ids[t] >= 0)
      for (int64_t k = 0; k < d; ++k) want[size_t(ids[t] * d + k)] += drows.values[size_t(t * d + k)];

  auto d_ids = DeviceBuffer::from_host(ids), d_rows = DeviceBuffer::from_host(drows.bits);
  std::vector<float> got[2];
  for (auto& g : got) {
    auto d_table = DeviceBuffer::from_host(table0);
    trex::cuda::embed_rows_masked_bwd(d_table.as<float>(), d_ids.as<int32_t>(), d_rows.as<bf16>(), n, d);
    TREX_CUDA(cudaDeviceSynchronize());
    g = d_table.to_host<float>();
  }
  EXPECT_LT(rel_err(got[0], want), 1e-6);
  for (int64_t r = V - 3; r < V; ++r)
    EXPECT_EQ(0, std::memcmp(&got[0][size_t(r * d)], &table0[size_t(r * d)], size_t(d) * sizeof(float))) << r;
  EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float))) << "two runs differ";
}
