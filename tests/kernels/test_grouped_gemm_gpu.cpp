// The grouped expert GEMMs (kernels/cuda/grouped_gemm.h) against a double-precision CPU loop over experts, with
// skewed per-expert row counts: empty experts, a single row, one expert taking every row, counts that are not
// multiples of the 128-row tile, and in/out that are not multiples of the 128-column tile. Outputs start as NaN
// so an unwritten row fails. Tolerances: bf16 outputs 1e-2 relative L2 (bf16 rounding of the result is ~3e-3);
// the fp32 weight gradient 1e-5 on the increment, and experts without rows must keep their gradient bit for bit.
// Every case runs through the public entry points (whatever the dispatch picks on this device, and the dw
// overload without a row count) and on each path of grouped_gemm_dispatch.h the device can run (the mma.sync
// fallback's two tilings everywhere, the sm90 kernel on an sm_90 device), so an H200 checks the fallback too;
// DispatchChoosesByDeviceAndShape checks which shapes take which path on both kinds of device. The measured
// alternatives to these kernels are checked by dev/grouped_gemm/wgmma_bench.cu. DISABLED_Bench times the product
// at flash-l4 / small-s6 shapes against one cuBLASLt GEMM per expert (run it with --gtest_also_run_disabled_tests);
// it checks agreement with cuBLASLt and prints TFLOP/s.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>

#include "gpu_test_util.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm_dispatch.h"
#include "kernels/cuda/random_fill.h"

using trex::cuda::bf16;
using trex::cuda::DeviceBuffer;
using namespace trex::gpu_test;
namespace gg = trex::cuda::grouped_gemm;

namespace {

std::vector<int32_t> offsets_of(const std::vector<int32_t>& counts) {
  std::vector<int32_t> o(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) o[e + 1] = o[e] + counts[e];
  return o;
}

DeviceBuffer upload(const void* p, size_t bytes) {
  DeviceBuffer b(std::max<size_t>(bytes, 4));
  if (bytes) TREX_CUDA(cudaMemcpy(b.as(), p, bytes, cudaMemcpyHostToDevice));
  return b;
}

std::vector<float> download_bf16(const DeviceBuffer& b, size_t n) {
  std::vector<uint16_t> bits(n);
  TREX_CUDA(cudaMemcpy(bits.data(), b.as(), n * 2, cudaMemcpyDeviceToHost));
  return to_f32(bits);
}

std::vector<float> download_f32(const DeviceBuffer& b, size_t n) {
  std::vector<float> v(n);
  TREX_CUDA(cudaMemcpy(v.data(), b.as(), n * 4, cudaMemcpyDeviceToHost));
  return v;
}

// How a case is run: the public entry points (the product's own choice of path; dw with or without the row
// count), or one path of the dispatch.
struct Runner {
  std::string name;
  std::optional<gg::Path> path;  // empty: the public entry points
  bool dw_without_rows = false;
};

std::vector<Runner> runners() {
  std::vector<Runner> r = {{"public", {}, false},
                           {"public, dw without rows", {}, true},
                           {"path mma.sync small", gg::Path::MmaSmall},
                           {"path mma.sync large", gg::Path::MmaLarge}};
  if (gg::sm90_device()) r.push_back({"path sm90", gg::Path::Sm90});
  else std::printf("(no sm90 device: the sm90 path is not run)\n");
  return r;
}

void check_case(const std::vector<int32_t>& counts, int64_t in, int64_t out, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "experts " << counts.size() << " in " << in << " out " << out);
  const int64_t E = int64_t(counts.size());
  const std::vector<int32_t> off = offsets_of(counts);
  const int64_t rows = off.back();
  const Bf16Data x = random_bf16(size_t(rows * in), seed), dy = random_bf16(size_t(rows * out), seed + 1);
  const Bf16Data W = random_bf16(size_t(E * out * in), seed + 2, 0.1f);
  const std::vector<float> g0 = random_f32(size_t(E * out * in), seed + 3);

  std::vector<float> ry(size_t(rows * out)), rdx(size_t(rows * in)), rdw(size_t(E * out * in), 0.f);
  for (int64_t e = 0; e < E; ++e) {
    const float* We = W.values.data() + e * out * in;
    for (int64_t r = off[size_t(e)]; r < off[size_t(e + 1)]; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i) s += double(x.values[size_t(r * in + i)]) * We[o * in + i];
        ry[size_t(r * out + o)] = float(s);
      }
      for (int64_t i = 0; i < in; ++i) {
        double s = 0;
        for (int64_t o = 0; o < out; ++o) s += double(dy.values[size_t(r * out + o)]) * We[o * in + i];
        rdx[size_t(r * in + i)] = float(s);
      }
    }
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double s = 0;
        for (int64_t r = off[size_t(e)]; r < off[size_t(e + 1)]; ++r)
          s += double(dy.values[size_t(r * out + o)]) * x.values[size_t(r * in + i)];
        rdw[size_t((e * out + o) * in + i)] = float(s);
      }
  }

  DeviceBuffer d_off = upload(off.data(), off.size() * 4);
  DeviceBuffer d_x = upload(x.bits.data(), x.bits.size() * 2), d_dy = upload(dy.bits.data(), dy.bits.size() * 2);
  DeviceBuffer d_W = upload(W.bits.data(), W.bits.size() * 2);
  DeviceBuffer d_scratch(size_t(trex::cuda::grouped_linear_scratch(E)) * 4);
  auto* sc = d_scratch.as<int32_t>();
  for (const Runner& run : runners()) {
    SCOPED_TRACE(run.name);
    DeviceBuffer d_g = upload(g0.data(), g0.size() * 4);
    DeviceBuffer d_y = poisoned<uint16_t>(size_t(std::max<int64_t>(rows * out, 1)));
    DeviceBuffer d_dx = poisoned<uint16_t>(size_t(std::max<int64_t>(rows * in, 1)));
    const auto* o = d_off.as<int32_t>();
    if (run.path) {
      gg::run_fwd(*run.path, d_y.as<bf16>(), d_x.as<bf16>(), d_W.as<bf16>(), o, E, rows, in, out, sc, nullptr);
      gg::run_dx(*run.path, d_dx.as<bf16>(), d_dy.as<bf16>(), d_W.as<bf16>(), o, E, rows, in, out, sc, nullptr);
      gg::run_dw(*run.path, d_g.as<float>(), d_dy.as<bf16>(), d_x.as<bf16>(), o, E, rows, in, out, nullptr);
    } else {
      trex::cuda::grouped_linear_fwd(d_y.as<bf16>(), d_x.as<bf16>(), d_W.as<bf16>(), o, E, rows, in, out, sc);
      trex::cuda::grouped_linear_dx(d_dx.as<bf16>(), d_dy.as<bf16>(), d_W.as<bf16>(), o, E, rows, in, out, sc);
      if (run.dw_without_rows)
        trex::cuda::grouped_linear_dw(d_g.as<float>(), d_dy.as<bf16>(), d_x.as<bf16>(), o, E, in, out);
      else
        trex::cuda::grouped_linear_dw(d_g.as<float>(), d_dy.as<bf16>(), d_x.as<bf16>(), o, E, rows, in, out);
    }
    TREX_CUDA(cudaDeviceSynchronize());

    if (rows > 0) {
      EXPECT_LT(rel_err(download_bf16(d_y, size_t(rows * out)), ry), 1e-2) << "fwd";
      EXPECT_LT(rel_err(download_bf16(d_dx, size_t(rows * in)), rdx), 1e-2) << "dx";
    }
    const std::vector<float> g = download_f32(d_g, g0.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double inc = double(g[i] - g0[i]);
      num += (inc - rdw[i]) * (inc - rdw[i]);
      den += double(rdw[i]) * rdw[i];
    }
    if (den > 0) {
      EXPECT_LT(std::sqrt(num / den), 1e-5) << "dw increment";
    }
    for (int64_t e = 0; e < E; ++e) {
      if (counts[size_t(e)] == 0) {
        EXPECT_EQ(std::memcmp(g.data() + e * out * in, g0.data() + e * out * in, size_t(out * in) * 4), 0)
            << "dw of empty expert " << e << " changed";
      }
    }
  }
}

// Which path each call takes, on an sm90 device and elsewhere: the branches of choose() at their boundaries.
TEST(GroupedGemmGpu, DispatchChoosesByDeviceAndShape) {
  using gg::Form;
  using gg::Path;
  for (Form f : {Form::Fwd, Form::Dx, Form::Dw}) {
    EXPECT_EQ(gg::choose(f, true, 1000, 4096, 4096, 16), Path::Sm90);
    EXPECT_EQ(gg::choose(f, true, 0, 8, 8, 1), Path::Sm90);
    // Extents past the sm90 kernel's int32 coordinates: the mma.sync kernel, large tiles by then.
    EXPECT_EQ(gg::choose(f, true, int64_t(1) << 31, 4096, 4096, 16), Path::MmaLarge);
    EXPECT_EQ(gg::choose(f, true, 1 << 20, 1 << 20, 1 << 20, 1), Path::MmaLarge);  // in * out * E = 2^40
  }
  // The dw overload without a row count never takes the sm90 kernel (its tensor maps need the extent).
  EXPECT_EQ(gg::choose(Form::Dw, true, gg::kRowsUnknown, 256, 128, 263), Path::MmaSmall);
  EXPECT_EQ(gg::choose(Form::Dw, true, gg::kRowsUnknown, 256, 128, 264), Path::MmaLarge);
  // Elsewhere: the large tile from 264 of them (rows / 128 x n / 256; dw: experts x out / 128 x in / 256).
  EXPECT_EQ(gg::choose(Form::Fwd, false, 128 * 33, 8, 256 * 8, 4), Path::MmaLarge);
  EXPECT_EQ(gg::choose(Form::Fwd, false, 128 * 33 - 1, 8, 256 * 8, 4), Path::MmaSmall);
  EXPECT_EQ(gg::choose(Form::Dx, false, 128 * 33, 256 * 8, 8, 4), Path::MmaLarge);
  EXPECT_EQ(gg::choose(Form::Dx, false, 128 * 33, 8, 256 * 8, 4), Path::MmaSmall);
  EXPECT_EQ(gg::choose(Form::Dw, false, 5, 256, 128, 264), Path::MmaLarge);
  EXPECT_EQ(gg::choose(Form::Dw, false, 5, 256, 128, 263), Path::MmaSmall);
  EXPECT_EQ(gg::choose(Form::Fwd, false, 49152, 4096, 4096, 16), Path::MmaLarge);  // flash-l4 w13
}

TEST(GroupedGemmGpu, SkewedCountsAndTails) {
  check_case({50, 0, 200, 1, 0, 82}, 136, 200, 1);  // tails in every dimension, empty experts
  check_case({0, 0, 333, 0}, 256, 128, 2);           // one expert takes every row; exact column tiles
  check_case({0, 0, 0, 7}, 8, 264, 3);               // only the last expert; in = 8
  check_case({129, 127, 128, 256, 1}, 72, 40, 4);    // rows around the tile size
  check_case({300}, 96, 520, 5);                    // a single expert (plain GEMM)
}

// Larger skewed cases at the sm90 tile grain: experts whose rows end mid-tile (so a row tile reads the next
// expert's rows, which the store must mask), a k range of the weight gradient that ends mid k-tile (zeroed in
// shared memory), several k-tiles, empty experts between full ones, and output columns past the 256-wide tile.
TEST(GroupedGemmGpu, TileGrainSkew) {
  check_case({0, 1, 300, 129, 0, 64, 191}, 320, 384, 11);
  check_case({700, 0, 0, 65}, 192, 200, 12);
  check_case({0, 257, 3, 0, 383}, 512, 256, 13);
}

// The public dw without a row count at 264 large tiles (264 experts x one 128 x 256 tile): the dispatch's own
// switch to the large mma.sync tile, checked end to end (the path runs in every case above too).
TEST(GroupedGemmGpu, DwWithoutRowCountAtTheLargeTileSwitch) {
  ASSERT_EQ(gg::choose(gg::Form::Dw, gg::sm90_device(), gg::kRowsUnknown, 256, 128, 264), gg::Path::MmaLarge);
  std::vector<int32_t> counts(264);
  for (size_t e = 0; e < counts.size(); ++e) counts[e] = int32_t(e % 5 == 0 ? 0 : e % 13 + 1);
  check_case(counts, 256, 128, 21);
}

TEST(GroupedGemmGpu, ManyExpertsSpanSeveralPrefixRounds) {
  std::vector<int32_t> counts(2500, 0);  // the tile prefix scans 1024 experts per round
  for (size_t e = 0; e < counts.size(); ++e) counts[e] = (e % 7 == 0) ? int32_t(e % 5) : 0;
  counts[2499] = 130;
  check_case(counts, 16, 24, 7);
}

TEST(GroupedGemmGpu, AllExpertsEmpty) {
  check_case({0, 0, 0}, 64, 64, 6);  // nothing to do: outputs untouched, gradients unchanged
}

TEST(GroupedGemmGpu, RejectsBadInput) {
  DeviceBuffer off(64), sc(64), buf(1024);
  EXPECT_THROW(trex::cuda::grouped_linear_fwd(nullptr, nullptr, nullptr, off.as<int32_t>(), 2, 16, 12, 16,
                                              sc.as<int32_t>()),
               trex::Error);
  EXPECT_THROW(trex::cuda::grouped_linear_dw(nullptr, nullptr, nullptr, off.as<int32_t>(), 0, 16, 16), trex::Error);
  // Operands off the 16-byte grain (cp.async / TMA read 16-byte vectors): a clear error, not a fault.
  bf16* odd = buf.as<bf16>() + 1;
  EXPECT_THROW(trex::cuda::grouped_linear_fwd(buf.as<bf16>(), odd, buf.as<bf16>(), off.as<int32_t>(), 1, 8, 8, 8,
                                              sc.as<int32_t>()),
               trex::Error);
  // The sm90 path refuses what it cannot run: a dw without a row count, or any call off an sm90 device.
  EXPECT_THROW(gg::run_dw(gg::Path::Sm90, buf.as<float>(), buf.as<bf16>(), buf.as<bf16>(), off.as<int32_t>(), 1,
                          gg::kRowsUnknown, 8, 8, nullptr),
               trex::Error);
  if (!gg::sm90_device()) {
    EXPECT_THROW(gg::run_fwd(gg::Path::Sm90, buf.as<bf16>(), buf.as<bf16>(), buf.as<bf16>(), off.as<int32_t>(), 1,
                             8, 8, 8, sc.as<int32_t>(), nullptr),
                 trex::Error);
  }
}

// --- Benchmark (disabled by default) --------------------------------------------------------------------------

double time_ms(const std::function<void()>& f, int reps) {
  f();
  TREX_CUDA(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  TREX_CUDA(cudaEventCreate(&a));
  TREX_CUDA(cudaEventCreate(&b));
  TREX_CUDA(cudaEventRecord(a));
  for (int i = 0; i < reps; ++i) f();
  TREX_CUDA(cudaEventRecord(b));
  TREX_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  TREX_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

void bench_shape(const char* name, int64_t E, int64_t rows_per_e, int64_t in, int64_t out) {
  std::vector<int32_t> counts(static_cast<size_t>(E));
  std::mt19937 g(7);
  int64_t rows = 0;
  for (auto& c : counts) rows += (c = int32_t(rows_per_e * (0.75 + 0.5 * (g() % 1000) / 1000.0)) / 8 * 8);
  const std::vector<int32_t> off = offsets_of(counts);
  DeviceBuffer d_off = upload(off.data(), off.size() * 4);
  DeviceBuffer d_x(size_t(rows * in) * 2), d_dy(size_t(rows * out) * 2), d_W(size_t(E * out * in) * 2);
  trex::cuda::fill_uniform_bf16(d_x.as<bf16>(), rows * in, 11, 1.f);
  trex::cuda::fill_uniform_bf16(d_dy.as<bf16>(), rows * out, 12, 1.f);
  trex::cuda::fill_uniform_bf16(d_W.as<bf16>(), E * out * in, 13, 0.05f);
  DeviceBuffer d_sc(size_t(trex::cuda::grouped_linear_scratch(E)) * 4);
  DeviceBuffer y1(size_t(rows * out) * 2), y2(size_t(rows * out) * 2), dx1(size_t(rows * in) * 2),
      dx2(size_t(rows * in) * 2);
  DeviceBuffer dw1 = zeroed<float>(size_t(E * out * in)), dw2 = zeroed<float>(size_t(E * out * in));
  trex::cuda::Gemm gemm;
  auto* o = d_off.as<int32_t>();
  const auto* xb = d_x.as<bf16>();
  const auto* dyb = d_dy.as<bf16>();
  const auto* Wb = d_W.as<bf16>();
  using trex::cuda::GemmShape;
  using trex::cuda::GemmType;
  auto g_fwd = [&] { trex::cuda::grouped_linear_fwd(y1.as<bf16>(), xb, Wb, o, E, rows, in, out, d_sc.as<int32_t>()); };
  auto g_dx = [&] { trex::cuda::grouped_linear_dx(dx1.as<bf16>(), dyb, Wb, o, E, rows, in, out, d_sc.as<int32_t>()); };
  auto g_dw = [&] { trex::cuda::grouped_linear_dw(dw1.as<float>(), dyb, xb, o, E, rows, in, out); };
  auto c_fwd = [&] {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = off[size_t(e)], n = counts[size_t(e)];
      if (n) gemm.run(GemmShape{n, out, in, false, true, GemmType::BF16, GemmType::BF16, 1}, xb + r0 * in,
                      Wb + e * out * in, y2.as<bf16>() + r0 * out);
    }
  };
  auto c_dx = [&] {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = off[size_t(e)], n = counts[size_t(e)];
      if (n) gemm.run(GemmShape{n, in, out, false, false, GemmType::BF16, GemmType::BF16, 1}, dyb + r0 * out,
                      Wb + e * out * in, dx2.as<bf16>() + r0 * in);
    }
  };
  auto c_dw = [&] {
    for (int64_t e = 0; e < E; ++e) {
      const int64_t r0 = off[size_t(e)], n = counts[size_t(e)];
      if (n) gemm.run(GemmShape{out, in, n, true, false, GemmType::BF16, GemmType::F32, 1}, dyb + r0 * out,
                      xb + r0 * in, dw2.as<float>() + e * out * in, 1.f, 1.f);
    }
  };
  // Agreement (one call each from zero gradients) on the first and last 2^20 elements of each output (the first
  // and last experts; the whole outputs are gigabytes), then timing.
  g_fwd(), g_dx(), g_dw(), c_fwd(), c_dx(), c_dw();
  TREX_CUDA(cudaDeviceSynchronize());
  auto ends = [](const DeviceBuffer& b, size_t n, bool f32) {
    const size_t k = std::min<size_t>(n, size_t(1) << 20), es = f32 ? 4 : 2;
    std::vector<float> out;
    for (size_t start : {size_t(0), n - k}) {
      DeviceBuffer part(k * es);
      TREX_CUDA(cudaMemcpy(part.as(), static_cast<const char*>(b.as()) + start * es, k * es,
                           cudaMemcpyDeviceToDevice));
      const std::vector<float> v = f32 ? download_f32(part, k) : download_bf16(part, k);
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  const double e_fwd = rel_err(ends(y1, size_t(rows * out), false), ends(y2, size_t(rows * out), false));
  const double e_dx = rel_err(ends(dx1, size_t(rows * in), false), ends(dx2, size_t(rows * in), false));
  const double e_dw = rel_err(ends(dw1, size_t(E * out * in), true), ends(dw2, size_t(E * out * in), true));
  EXPECT_LT(e_fwd, 1e-2) << name;
  EXPECT_LT(e_dx, 1e-2) << name;
  EXPECT_LT(e_dw, 1e-4) << name;
  const double flop = 2.0 * double(rows) * double(in) * double(out);
  // Best of three rounds, grouped and cuBLASLt in turn: the GPU's clock drifts with power over a run.
  const int reps = 10;
  double t[6] = {1e30, 1e30, 1e30, 1e30, 1e30, 1e30};
  const std::function<void()> fs[6] = {g_fwd, c_fwd, g_dx, c_dx, g_dw, c_dw};
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 6; ++i) t[i] = std::min(t[i], time_ms(fs[i], reps));
  const char* what[3] = {"fwd", "dx", "dw"};
  const double errs[3] = {e_fwd, e_dx, e_dw};
  for (int i = 0; i < 3; ++i)
    std::printf("BENCH %s %s path=%s E=%lld rows=%lld in=%lld out=%lld: grouped %.3f ms %.1f TFLOP/s | "
                "cuBLASLt per-expert %.3f ms %.1f TFLOP/s | rel_err vs cuBLASLt %.2e\n",
                name, what[i], gg::path_name(gg::choose(gg::Form(i), gg::sm90_device(), rows, in, out, E)),
                (long long)E, (long long)rows, (long long)in, (long long)out, t[2 * i], flop / t[2 * i] * 1e-9,
                t[2 * i + 1], flop / t[2 * i + 1] * 1e-9, errs[i]);
  std::fflush(stdout);
}

// The product (the public entry points) at the model's shapes; the measured alternatives are timed by
// dev/grouped_gemm/wgmma_bench.cu.
TEST(GroupedGemmGpu, DISABLED_Bench) {
  bench_shape("flash-l4 w13", 16, 3072, 4096, 4096);
  bench_shape("flash-l4 w2", 16, 3072, 2048, 4096);
  bench_shape("small-s6 w13", 32, 768, 2048, 2048);
  bench_shape("small-s6 w2", 32, 768, 1024, 2048);
}

}  // namespace
