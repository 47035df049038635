// The checkpoint de-quantisation kernel (kernels/cuda/dequant.h) against the host's (model/dsv4/checkpoint.h
// dequant_fp8_block / dequant_fp4_packed, core/dtype.h convert_to_f32): every element bit-equal (NaN codes: NaN on
// both), for every code of the data (all 256 FP8 bytes, all 16 FP4 nibbles), every scale dtype (E8M0 with its
// extreme exponents, whose products are subnormal or overflow; F32, BF16, F16), partial 128x128 blocks, and
// windows that start inside a block (the loader's TP slices and staging chunks), plus the plain BF16 / F16 / F32 /
// F64 conversions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "comm/two_rank_threads.h"
#include "core/dtype.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/device_buffer.h"
#include "model/dsv4/checkpoint.h"

namespace {

using namespace trex;
using trex::cuda::DeviceBuffer;
using trex::cuda::StoredType;
using trex::cuda::stored_type;

// Random scale values of dtype dt, `n` of them, as raw bytes: E8M0 every exponent 0..254 (NaN 255 excluded by
// design §3.5) and floats over a wide range of powers of two times a mantissa.
std::vector<uint8_t> random_scales(DType dt, size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<uint8_t> out(dtype_bytes(dt, n));
  for (size_t i = 0; i < n; ++i) {
    if (dt == DType::F8_E8M0) {
      out[i] = uint8_t(i < 255 ? i : g() % 255);
      continue;
    }
    const float v = std::ldexp(1.0f + float(g() % 1000) / 1000.f, int(g() % 60) - 30) * ((g() & 1) ? -1.f : 1.f);
    convert_from_f32(&v, dt, out.data() + i * size_t(dtype_bits(dt) / 8), 1);
  }
  return out;
}

void expect_bit_equal(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    uint32_t a, b;
    std::memcpy(&a, &got[i], 4);
    std::memcpy(&b, &want[i], 4);
    if (a != b && bad++ < 5) ADD_FAILURE() << what << ": element " << i << " GPU " << got[i] << " CPU " << want[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

// Rows [r0, r1) x cols [c0, c1) of a [R, C] tensor of `bits`-bit elements, dense.
std::vector<uint8_t> window_bytes(const std::vector<uint8_t>& full, int64_t C, int bits, int64_t r0, int64_t r1,
                                  int64_t c0, int64_t c1) {
  std::vector<uint8_t> out;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = full.data() + size_t(r * C * bits / 8);
    out.insert(out.end(), row + c0 * bits / 8, row + c1 * bits / 8);
  }
  return out;
}

struct Case {
  int64_t R, C, r0, r1, c0, c1;
};

// One quantised case: data codes `q` ([R, C] of `bits`), scale [SR, SC] of sdt with blocks br x bc.
void run_quantised(bool fp8, DType sdt, const Case& k, int64_t block, uint32_t seed) {
  const int bits = fp8 ? 8 : 4;
  const int64_t br = fp8 ? block : 1, bc = fp8 ? block : 32;
  const int64_t SR = (k.R + br - 1) / br, SC = (k.C + bc - 1) / bc;
  std::mt19937 g(seed);
  std::vector<uint8_t> q(size_t(k.R * k.C * bits / 8));
  for (size_t i = 0; i < q.size(); ++i) q[i] = uint8_t(i < 256 ? i : g());  // every code appears
  const std::vector<uint8_t> s = random_scales(sdt, size_t(SR * SC), seed + 1);
  std::vector<float> ref(size_t(k.R * k.C));
  if (fp8)
    dsv4::dequant_fp8_block(q.data(), k.R, k.C, s.data(), sdt, block, ref.data());
  else
    dsv4::dequant_fp4_packed(q.data(), k.R, k.C, s.data(), sdt, ref.data());

  const std::vector<uint8_t> wq = window_bytes(q, k.C, bits, k.r0, k.r1, k.c0, k.c1);
  const int64_t sa = k.r0 / br, sb = (k.r1 - 1) / br, sca = k.c0 / bc, scb = (k.c1 - 1) / bc;
  const std::vector<uint8_t> ws = window_bytes(s, SC, dtype_bits(sdt), sa, sb + 1, sca, scb + 1);
  DeviceBuffer dq = DeviceBuffer::from_host(wq), ds = DeviceBuffer::from_host(ws);
  const int64_t rows = k.r1 - k.r0, cols = k.c1 - k.c0, ld = cols + 3;  // a padded output row
  DeviceBuffer out(size_t(rows * ld) * sizeof(float));
  cuda::DequantWindow w;
  w.type = fp8 ? StoredType::F8_E4M3 : StoredType::F4_E2M1;
  w.data = dq.as<void>();
  w.rows = rows, w.cols = cols, w.row0 = k.r0, w.col0 = k.c0;
  w.scaled = true;
  w.scale_type = stored_type(sdt, "scale");
  w.scale = ds.as<void>();
  w.scale_ld = scb - sca + 1, w.srow0 = sa, w.scol0 = sca, w.block_rows = br, w.block_cols = bc;
  w.out = out.as<float>();
  w.out_ld = ld;
  cuda::dequant_window(w, cuda::decode_tables());
  const std::vector<float> got_padded = out.to_host<float>();
  std::vector<float> got, want;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      got.push_back(got_padded[size_t(i * ld + j)]);
      want.push_back(ref[size_t((k.r0 + i) * k.C + k.c0 + j)]);
    }
  expect_bit_equal(got, want, fp8 ? "FP8" : "FP4");
}

TEST(DequantGpu, Fp8BlocksBitEqualToTheHost) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const DType scales[] = {DType::F8_E8M0, DType::F32, DType::BF16, DType::F16};
  const Case cases[] = {{300, 260, 0, 300, 0, 260},    // whole, partial last blocks
                        {300, 260, 37, 250, 5, 200},   // a window starting inside blocks
                        {256, 384, 128, 256, 128, 256}, // one TP half of each axis
                        {1, 700, 0, 1, 13, 699}};       // one row, chunked columns
  uint32_t seed = 1;
  for (DType sdt : scales)
    for (const Case& k : cases)
      for (int64_t block : {128, 32}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(sdt) << " block " << block << " [" << k.R << "," << k.C << "] rows "
                                        << k.r0 << ".." << k.r1 << " cols " << k.c0 << ".." << k.c1);
        run_quantised(true, sdt, k, block, seed++);
      }
}

TEST(DequantGpu, Fp4PackedBitEqualToTheHost) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  const DType scales[] = {DType::F8_E8M0, DType::F32, DType::BF16, DType::F16};
  const Case cases[] = {{70, 192, 0, 70, 0, 192}, {70, 192, 3, 61, 64, 160}, {70, 192, 5, 6, 2, 190}};
  uint32_t seed = 100;
  for (DType sdt : scales)
    for (const Case& k : cases) {
      SCOPED_TRACE(::testing::Message() << dtype_name(sdt) << " rows " << k.r0 << ".." << k.r1 << " cols " << k.c0
                                      << ".." << k.c1);
      run_quantised(false, sdt, k, 0, seed++);
    }
}

TEST(DequantGpu, PlainConversionsBitEqualToTheHost) {
  if (trex::testing::n_devices() < 1) GTEST_SKIP() << "needs a GPU";
  std::mt19937 g(5);
  for (DType dt : {DType::BF16, DType::F16, DType::F32, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t R = 33, C = 2053, r0 = 4, r1 = 30, c0 = 17, c1 = 2000;
    const int bits = dtype_bits(dt);
    std::vector<uint8_t> raw(size_t(R * C * bits / 8));
    for (auto& b : raw) b = uint8_t(g());
    if (dt == DType::BF16 || dt == DType::F16)  // every 16-bit code once
      for (size_t c = 0; c < 65536 && 2 * c + 1 < raw.size(); ++c) raw[2 * c] = uint8_t(c), raw[2 * c + 1] = uint8_t(c >> 8);
    std::vector<float> ref(size_t(R * C));
    convert_to_f32(dt, raw.data(), ref.data(), ref.size());
    const std::vector<uint8_t> wq = window_bytes(raw, C, bits, r0, r1, c0, c1);
    DeviceBuffer dq = DeviceBuffer::from_host(wq), out(size_t((r1 - r0) * (c1 - c0)) * sizeof(float));
    cuda::DequantWindow w;
    w.type = stored_type(dt, "data");
    w.data = dq.as<void>();
    w.rows = r1 - r0, w.cols = c1 - c0, w.row0 = r0, w.col0 = c0;
    w.out = out.as<float>();
    w.out_ld = c1 - c0;
    cuda::dequant_window(w, cuda::decode_tables());
    const std::vector<float> got = out.to_host<float>();
    std::vector<float> want;
    for (int64_t i = r0; i < r1; ++i)
      for (int64_t j = c0; j < c1; ++j) want.push_back(ref[size_t(i * C + j)]);
    expect_bit_equal(got, want, dtype_name(dt).data());
  }
}

}  // namespace
