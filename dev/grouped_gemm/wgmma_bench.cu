// Dev benchmark of the grouped expert GEMMs, version by version (variants.cuh: the mma.sync tilings m1-m6 and
// the Hopper wgmma versions v1-v11, the product's m1 / m3 / v10 among them), against one cuBLAS GEMM per expert,
// with a double-precision CPU check on small skewed cases. See README.md for the versions. Build (device): nvcc
// -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -I src dev/grouped_gemm/wgmma_bench.cu -lcublas -o
// wgmma_bench (dev/grouped_gemm/device.sh does). Run: wgmma_bench [reps=10]; GG_CASE=small|flash|small-s6|decode runs
// one group, GG_V=m3,1,10 only those versions (a bare number is an sm90 version), GG_NGROUP=n the sm90 fwd / dx
// walk's n-tile groups (0 = ungrouped; default the product's).
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "variants.cuh"

using gg_dev::bf16;
using gg_dev::Form;
namespace sm90 = gg_dev::sm90;

#define CK(x)                                                                                     \
  do {                                                                                            \
    cudaError_t e_ = (x);                                                                         \
    if (e_ != cudaSuccess) {                                                                      \
      std::printf("FAIL cuda %s at %s:%d: %s\n", #x, __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

__global__ void fill_kernel(bf16* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed * 40503u ^ uint32_t(i >> 32) * 97u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
    p[i] = __float2bfloat16((float(h & 0xFFFFFF) / float(0x1000000) * 2.f - 1.f) * scale);
  }
}
template <class T>
__global__ void diff_kernel(const T* a, const T* b, int64_t n, double* acc) {
  double num = 0, den = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double x = double(float(a[i])), y = double(float(b[i]));
    num += (x - y) * (x - y), den += y * y;
  }
  atomicAdd(acc, num), atomicAdd(acc + 1, den);
}
template <class T>
double rel_diff(const T* a, const T* b, int64_t n) {
  double* d;
  CK(cudaMalloc(&d, 16));
  CK(cudaMemset(d, 0, 16));
  diff_kernel<T><<<1024, 256>>>(a, b, n, d);
  double h[2];
  CK(cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost));
  cudaFree(d);
  return h[1] > 0 ? std::sqrt(h[0] / h[1]) : std::sqrt(h[0]);
}

struct Problem {
  int64_t E, rows, in, out;
  std::vector<int32_t> counts, off;
  bf16 *x, *dy, *W, *y, *dx;
  float* dW;
  int32_t *d_off, *d_ts;
  Problem(std::vector<int32_t> c, int64_t in_, int64_t out_)
      : E(int64_t(c.size())), in(in_), out(out_), counts(c) {
    off.assign(c.size() + 1, 0);
    for (size_t e = 0; e < c.size(); ++e) off[e + 1] = off[e] + c[e];
    rows = off.back();
    const int64_t R = rows > 0 ? rows : 1;
    CK(cudaMalloc(&x, R * in * 2));
    CK(cudaMalloc(&dy, R * out * 2));
    CK(cudaMalloc(&W, E * in * out * 2));
    CK(cudaMalloc(&y, R * out * 2));
    CK(cudaMalloc(&dx, R * in * 2));
    CK(cudaMalloc(&dW, E * in * out * 4));
    CK(cudaMalloc(&d_off, (E + 1) * 4));
    CK(cudaMalloc(&d_ts, (E + 1) * 4));
    CK(cudaMemcpy(d_off, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice));
    fill_kernel<<<1024, 256>>>(x, R * in, 11, 1.f);
    fill_kernel<<<1024, 256>>>(dy, R * out, 12, 1.f);
    fill_kernel<<<1024, 256>>>(W, E * in * out, 13, 0.05f);
    CK(cudaGetLastError());
  }
  ~Problem() {
    cudaFree(x), cudaFree(dy), cudaFree(W), cudaFree(y), cudaFree(dx), cudaFree(dW), cudaFree(d_off),
        cudaFree(d_ts);
  }
};

int g_n_group = sm90::kNGroup;  // GG_NGROUP

// Every version id (variants.cuh): mma.sync m1..m6, then sm90 v1..v11.
std::vector<int> all_versions() {
  std::vector<int> v;
  for (int m = 1; m <= gg_dev::kMmaVersions; ++m) v.push_back(-m);
  for (int s = 1; s <= gg_dev::kSm90Versions; ++s) v.push_back(s);
  return v;
}
// GG_V=m1,3,v10 runs only those versions (all by default; "3" = "v3").
bool enabled(int id) {
  const char* e = std::getenv("GG_V");
  if (!e || !*e) return true;
  for (const char* q = e; *q;) {
    const bool m = *q == 'm' || *q == 'M';
    if (m || *q == 'v' || *q == 'V') ++q;
    char* end;
    const long x = std::strtol(q, &end, 10);
    if (end == q) break;
    if ((m ? -x : x) == id) return true;
    q = *end ? end + 1 : end;
  }
  return false;
}
std::string label(int id) { return gg_dev::name(id) + (gg_dev::is_product(id) ? " (product)" : ""); }
template <Form F>
cudaError_t run_variant(int id, Problem& P) {
  void* out = F == Form::Fwd ? (void*)P.y : F == Form::Dx ? (void*)P.dx : (void*)P.dW;
  const bf16* a = F == Form::Fwd ? P.x : P.dy;
  const bf16* b = F == Form::Dw ? P.x : P.W;
  return gg_dev::run_version<F>(id, out, a, b, P.d_off, P.d_ts, P.E, P.rows, P.in, P.out, g_n_group);
}

// One cuBLAS GEMM per expert (column-major views of the row-major operands).
void cublas_form(cublasHandle_t h, Form f, Problem& P, bf16* y, bf16* dx, float* dW) {
  const float one = 1.f, zero = 0.f;
  for (int64_t e = 0; e < P.E; ++e) {
    const int n = P.counts[e];
    if (!n) continue;
    const int64_t r0 = P.off[e];
    const bf16* We = P.W + e * P.in * P.out;
    if (f == Form::Fwd)
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(P.out), n, int(P.in), &one, We, CUDA_R_16BF, int(P.in),
                   P.x + r0 * P.in, CUDA_R_16BF, int(P.in), &zero, y + r0 * P.out, CUDA_R_16BF, int(P.out),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else if (f == Form::Dx)
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, int(P.in), n, int(P.out), &one, We, CUDA_R_16BF, int(P.in),
                   P.dy + r0 * P.out, CUDA_R_16BF, int(P.out), &zero, dx + r0 * P.in, CUDA_R_16BF, int(P.in),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
      cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, int(P.in), int(P.out), n, &one, P.x + r0 * P.in, CUDA_R_16BF,
                   int(P.in), P.dy + r0 * P.out, CUDA_R_16BF, int(P.out), &one, dW + e * P.in * P.out,
                   CUDA_R_32F, int(P.in), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
}

template <class T>
std::vector<float> down(const T* p, int64_t n) {
  std::vector<T> h(static_cast<size_t>(n));
  CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> f(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) f[i] = float(h[i]);
  return f;
}

int g_fail = 0;

// Small case: every variant and form against a double loop on the CPU (NaN-poisoned outputs; dW starts at 1.0
// and must keep that bit for bit on empty experts).
void small_case(std::vector<int32_t> counts, int64_t in, int64_t out) {
  Problem P(counts, in, out);
  const int64_t R = P.rows;
  std::vector<float> x = down(P.x, R * in), dy = down(P.dy, R * out), W = down(P.W, P.E * in * out);
  std::vector<double> ry(R * out), rdx(R * in), rdw(P.E * in * out, 0.0);
  for (int64_t e = 0; e < P.E; ++e) {
    const float* We = W.data() + e * out * in;
    for (int64_t r = P.off[e]; r < P.off[e + 1]; ++r) {
      for (int64_t o = 0; o < out; ++o) {
        double s = 0;
        for (int64_t i = 0; i < in; ++i) s += double(x[r * in + i]) * We[o * in + i];
        ry[r * out + o] = s;
      }
      for (int64_t i = 0; i < in; ++i) {
        double s = 0;
        for (int64_t o = 0; o < out; ++o) s += double(dy[r * out + o]) * We[o * in + i];
        rdx[r * in + i] = s;
      }
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i)
          rdw[(e * out + o) * in + i] += double(dy[r * out + o]) * x[r * in + i];
    }
  }
  auto err = [](const std::vector<float>& g, const std::vector<double>& r, double base) {
    double num = 0, den = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      const double d = double(g[i]) - base - r[i];
      num += std::isfinite(d) ? d * d : 1e30;
      den += r[i] * r[i];
    }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  };
  char desc[128];
  std::snprintf(desc, sizeof desc, "E=%lld rows=%lld in=%lld out=%lld", (long long)P.E, (long long)R,
                (long long)in, (long long)out);
  for (int v : all_versions()) {
    if (!enabled(v)) continue;
    if (!gg_dev::runs(v, Form::Fwd, in, out) || !gg_dev::runs(v, Form::Dx, in, out)) continue;
    const bool dw_ok = gg_dev::runs(v, Form::Dw, in, out);  // along M, dw pairs the tiles of `out`
    CK(cudaMemset(P.y, 0xFF, R * out * 2));
    CK(cudaMemset(P.dx, 0xFF, R * in * 2));
    std::vector<float> ones(P.E * in * out, 1.f);
    CK(cudaMemcpy(P.dW, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
    CK(run_variant<Form::Fwd>(v, P));
    CK(run_variant<Form::Dx>(v, P));
    if (dw_ok) CK(run_variant<Form::Dw>(v, P));
    CK(cudaDeviceSynchronize());
    const double ef = err(down(P.y, R * out), ry, 0), ed = err(down(P.dx, R * in), rdx, 0);
    const std::vector<float> g = down(P.dW, P.E * in * out);
    const double ew = dw_ok ? err(g, rdw, 1.0) : 0.0;
    bool empty_ok = true;
    for (int64_t e = 0; e < P.E; ++e)
      if (!counts[e])
        for (int64_t i = 0; i < in * out; ++i) empty_ok &= g[e * in * out + i] == 1.f;
    const bool ok = ef < 1e-2 && ed < 1e-2 && ew < 1e-5 && empty_ok;
    g_fail += !ok;
    std::printf("%s small %s %s: fwd %.2e dx %.2e dw %.2e%s empty-experts-untouched %s\n",
                ok ? "PASS" : "FAIL", label(v).c_str(), desc, ef, ed, ew, dw_ok ? "" : " (dw not run)",
                empty_ok ? "yes" : "NO");
  }
}

template <class F>
double time_ms(F&& f, int reps) {
  f();
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f();
  cudaEventRecord(b);
  CK(cudaEventSynchronize(b));
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return ms / reps;
}

void bench(const char* name, int64_t E, int64_t per_e, int64_t in, int64_t out, int reps, cublasHandle_t h) {
  std::vector<int32_t> counts(E);
  std::mt19937 g(7);
  for (auto& c : counts) c = int32_t(per_e * (0.75 + 0.5 * (g() % 1000) / 1000.0)) / 8 * 8;
  Problem P(counts, in, out);
  bf16 *y2, *dx2;
  float* dW2;
  CK(cudaMalloc(&y2, P.rows * out * 2));
  CK(cudaMalloc(&dx2, P.rows * in * 2));
  CK(cudaMalloc(&dW2, E * in * out * 4));
  const double flop = 2.0 * double(P.rows) * in * out;
  const char* fn[3] = {"fwd", "dx", "dw"};
  for (int f = 0; f < 3; ++f) {
    const Form form = Form(f);
    const auto run = [&](int v) {
      if (form == Form::Fwd) return run_variant<Form::Fwd>(v, P);
      if (form == Form::Dx) return run_variant<Form::Dx>(v, P);
      return run_variant<Form::Dw>(v, P);
    };
    // Agreement with cuBLAS first (dW from zero for both), then the timing: kRounds rounds of cuBLAS and
    // every variant in turn, the best round of each (the GPU's clock drifts with power over a run;
    // interleaving keeps the comparison fair).
    std::vector<int> vs;
    std::vector<double> errs;
    for (int v : all_versions()) {
      if (!enabled(v)) continue;
      CK(cudaMemset(dW2, 0, E * in * out * 4));
      CK(cudaMemset(P.dW, 0, E * in * out * 4));
      cublas_form(h, form, P, y2, dx2, dW2);
      const cudaError_t e0 = run(v);
      CK(cudaDeviceSynchronize());
      if (e0 != cudaSuccess) {
        std::printf("FAIL %s %s %s launch: %s\n", name, fn[f], label(v).c_str(), cudaGetErrorString(e0));
        ++g_fail;
        continue;
      }
      const double err = form == Form::Dw    ? rel_diff(P.dW, dW2, E * in * out)
                         : form == Form::Fwd ? rel_diff(P.y, y2, P.rows * out)
                                             : rel_diff(P.dx, dx2, P.rows * in);
      vs.push_back(v), errs.push_back(err);
    }
    constexpr int kRounds = 3;
    double tc = 1e30;
    std::vector<double> tv(vs.size(), 1e30);
    for (int round = 0; round < kRounds; ++round) {
      tc = std::min(tc, time_ms([&] { cublas_form(h, form, P, y2, dx2, dW2); }, reps));
      for (size_t i = 0; i < vs.size(); ++i) tv[i] = std::min(tv[i], time_ms([&] { run(vs[i]); }, reps));
    }
    std::printf(
        "BENCH %s %s E=%lld rows=%lld in=%lld out=%lld: cuBLAS per-expert %.3f ms %.1f TFLOP/s (best of %d "
        "rounds of %d)\n",
        name, fn[f], (long long)E, (long long)P.rows, (long long)in, (long long)out, tc, flop / tc * 1e-9,
        kRounds, reps);
    for (size_t i = 0; i < vs.size(); ++i) {
      const bool ok = errs[i] < (form == Form::Dw ? 1e-4 : 1e-2);
      g_fail += !ok;
      std::printf("BENCH %s %s %s: %.3f ms %.1f TFLOP/s (%.0f%% of cuBLAS time) rel_err %.2e %s\n", name,
                  fn[f], label(vs[i]).c_str(), tv[i], flop / tv[i] * 1e-9, 100.0 * tc / tv[i], errs[i],
                  ok ? "PASS" : "FAIL");
    }
    std::fflush(stdout);
  }
  cudaFree(y2), cudaFree(dx2), cudaFree(dW2);
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 10;
  if (const char* g = std::getenv("GG_NGROUP")) g_n_group = std::atoi(g);  // sm90 fwd/dx walk: n-tile groups
  const char* c = std::getenv("GG_CASE");
  const std::string only = c ? c : "";
  if (!sm90::available()) {
    std::printf("FAIL sm90 path not available on this device\n");
    return 1;
  }
  if (only.empty() || only == "small") {
    small_case({50, 0, 200, 1, 0, 82}, 136, 200);
    small_case({0, 0, 333, 0}, 256, 128);
    small_case({129, 127, 128, 256, 1}, 320, 264);
    small_case({300}, 96, 520);
    small_case({0, 0, 0, 7}, 64, 64);
  }
  cublasHandle_t h;
  cublasCreate(&h);
  if (only.empty() || only == "flash") {
    bench("flash-l4 w13", 16, 3072, 4096, 4096, reps, h);
    bench("flash-l4 w2", 16, 3072, 2048, 4096, reps, h);
  }
  if (only.empty() || only == "small-s6") {
    bench("small-s6 w13", 32, 768, 2048, 2048, reps, h);
    bench("small-s6 w2", 32, 768, 1024, 2048, reps, h);
  }
  if (only == "decode") {  // inference-sized steps: a few dozen rows per expert
    bench("decode flash-l4 w13", 16, 24, 4096, 4096, reps, h);
    bench("decode flash-l4 w2", 16, 24, 2048, 4096, reps, h);
  }
  cublasDestroy(h);
  std::printf("%s wgmma_bench: %d failures\n", g_fail ? "FAIL" : "PASS", g_fail);
  return g_fail ? 1 : 0;
}
