#include "model/cuda/checkpoint_stager.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant.h"
#include "model/dsv4/checkpoint.h"

namespace trex::dsv4gpu {

namespace {

using cuda::StoredType;

using cuda::stored_type;

// Copies of at least this size are split over threads: the first touch of the mapping reads the file.
constexpr size_t kParallelCopy = size_t(8) << 20;

void copy_bytes(uint8_t* dst, const uint8_t* src, size_t n) {
  if (n < kParallelCopy) {
    std::memcpy(dst, src, n);
    return;
  }
  constexpr size_t kPiece = size_t(1) << 20;
  const int64_t pieces = int64_t((n + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < pieces; ++k) {
    const size_t b = size_t(k) * kPiece;
    std::memcpy(dst + b, src + b, std::min(kPiece, n - b));
  }
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

struct CheckpointStager::Impl {
  const dsv4::CheckpointReader& ckpt;
  size_t half = 0;
  uint8_t* host = nullptr;  // pinned, 2 halves
  uint8_t* dev = nullptr;   // its device twin
  cudaEvent_t copied[2] = {nullptr, nullptr};
  bool pending[2] = {false, false};
  int next = 0;
  int64_t stored = 0;
  cuda::DecodeTables tables;
  explicit Impl(const dsv4::CheckpointReader& c) : ckpt(c) {}
};

CheckpointStager::CheckpointStager(const dsv4::CheckpointReader& ckpt, size_t staging_bytes)
    : impl_(std::make_unique<Impl>(ckpt)) {
  TREX_CHECK(staging_bytes >= 4096, "GPU checkpoint load: staging buffer of {} bytes is below the 4096 minimum",
             staging_bytes);
  Impl& m = *impl_;
  m.half = staging_bytes / 2 / 256 * 256;
  TREX_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&m.host), 2 * m.half, cudaHostAllocDefault));
  TREX_CUDA(cudaMalloc(reinterpret_cast<void**>(&m.dev), 2 * m.half));
  for (auto& e : m.copied) TREX_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  m.tables = cuda::decode_tables();
}

CheckpointStager::~CheckpointStager() {
  Impl& m = *impl_;
  cudaDeviceSynchronize();  // the last chunks' copies and kernels read the buffers
  for (auto& e : m.copied)
    if (e) cudaEventDestroy(e);
  if (m.dev) cudaFree(m.dev);
  if (m.host) cudaFreeHost(m.host);
}

void CheckpointStager::finish() { TREX_CUDA(cudaDeviceSynchronize()); }
int64_t CheckpointStager::stored_bytes() const { return impl_->stored; }
size_t CheckpointStager::host_bytes() const { return 2 * impl_->half; }

void CheckpointStager::view_2d(const std::string& name, const dsv4::CheckpointReader& ckpt, int64_t* R, int64_t* C) {
  const Shape& s = ckpt.shape(name);
  *C = s.empty() ? 1 : s.back();
  *R = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) *R *= s[i];
}

void CheckpointStager::read(const std::string& name, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* out,
                            int64_t out_ld) {
  Impl& m = *impl_;
  const dsv4::TensorSource& src = m.ckpt.source(name);
  const ckpt::SafetensorsReader& files = m.ckpt.files();
  const std::string what = fmt::format("GPU checkpoint load: tensor '{}' (stored as '{}' in {})", name, src.stored,
                                       files.file_of(src.stored).filename().string());
  int64_t R = 0, C = 0;
  view_2d(name, m.ckpt, &R, &C);
  TREX_CHECK(0 <= r0 && r0 <= r1 && r1 <= R && 0 <= c0 && c0 <= c1 && c1 <= C,
             "{}: window rows [{}, {}) x columns [{}, {}) outside its [{}, {}]", what, r0, r1, c0, c1, R, C);
  if (r0 == r1 || c0 == c1) return;

  const TensorView v = files.view(src.stored);
  const uint8_t* base = static_cast<const uint8_t*>(v.data);
  StoredType type;
  int bits = 0;
  bool scaled = false;
  int64_t br = 1, bc = 1;
  const uint8_t* sbase = nullptr;
  StoredType stype = StoredType::F8_E8M0;
  int64_t SC = 0, ssz = 0;
  switch (src.kind) {
    case dsv4::TensorSource::Kind::Plain:
    case dsv4::TensorSource::Kind::StackedSlice:
      type = stored_type(v.dtype, what);
      bits = dtype_bits(v.dtype);
      base += src.element_offset * size_t(bits / 8);
      break;
    case dsv4::TensorSource::Kind::Fp8Block:
    case dsv4::TensorSource::Kind::Fp4Packed: {
      const bool fp8 = src.kind == dsv4::TensorSource::Kind::Fp8Block;
      type = fp8 ? StoredType::F8_E4M3 : StoredType::F4_E2M1;
      bits = fp8 ? 8 : 4;
      scaled = true;
      br = fp8 ? m.ckpt.block_size() : 1;
      bc = fp8 ? m.ckpt.block_size() : 32;
      const TensorView s = files.view(src.scale);
      TREX_CHECK(s.dtype == DType::F8_E8M0 || s.dtype == DType::F32 || s.dtype == DType::BF16 ||
                     s.dtype == DType::F16,
                 "{}: scale '{}' dtype {} is not E8M0, F32, BF16 or F16", what, src.scale, dtype_name(s.dtype));
      stype = stored_type(s.dtype, what);
      sbase = static_cast<const uint8_t*>(s.data);
      SC = s.shape.size() == 2 ? s.shape[1] : 1;
      ssz = dtype_bits(s.dtype) / 8;
      break;
    }
    default:
      fail("{}: unknown storage kind", what);
  }
  TREX_CHECK(bits % 8 == 0 || ((c0 * bits) % 8 == 0 && (c1 * bits) % 8 == 0 && (C * bits) % 8 == 0),
             "{}: FP4 columns [{}, {}) of {} do not start and end on a byte", what, c0, c1, C);

  // Chunks of rows (whole window width), or of columns of one row when one row does not fit half the buffer.
  // Staged per chunk: its data, then (256-aligned) the scale blocks it touches; a row needs at most one scale row.
  const int64_t nsc_w = scaled ? (c1 - 1) / bc - c0 / bc + 1 : 0;
  const size_t room = m.half - 512;
  const size_t row_bytes = size_t((c1 - c0) * bits / 8), row_cost = row_bytes + size_t(nsc_w * ssz);
  int64_t rows_per = int64_t(room / row_cost), cols_per = c1 - c0;
  if (rows_per < 1) {
    rows_per = 1;
    cols_per = int64_t(room * 8 / size_t(bits + 8 * ssz)) / 2 * 2;  // at most one scale per element
    TREX_CHECK(cols_per >= 2, "{}: staging half of {} bytes too small", what, m.half);
  }
  for (int64_t a = r0; a < r1; a += rows_per) {
    const int64_t b = std::min(r1, a + rows_per);
    for (int64_t ca = c0; ca < c1; ca += cols_per) {
      const int64_t cb = std::min(c1, ca + cols_per);
      const int k = m.next;
      m.next ^= 1;
      if (m.pending[k]) TREX_CUDA(cudaEventSynchronize(m.copied[k]));  // its last copy to the device is done
      uint8_t* h = m.host + size_t(k) * m.half;
      const size_t wbytes = size_t((cb - ca) * bits / 8), full_row = size_t(C * bits / 8);
      if (ca == 0 && cb == C) {
        copy_bytes(h, base + size_t(a) * full_row, size_t(b - a) * full_row);
      } else {
        for (int64_t r = a; r < b; ++r)
          std::memcpy(h + size_t(r - a) * wbytes, base + size_t(r) * full_row + size_t(ca * bits / 8), wbytes);
      }
      size_t used = size_t(b - a) * wbytes;
      cuda::DequantWindow w;
      w.type = type;
      w.rows = b - a, w.cols = cb - ca, w.row0 = a, w.col0 = ca;
      size_t soff = 0;
      if (scaled) {
        soff = align_up(used, 256);
        const int64_t sa = a / br, sb = (b - 1) / br, sca = ca / bc, scb = (cb - 1) / bc, nsc = scb - sca + 1;
        const size_t sbytes = size_t(nsc * ssz);
        TREX_CHECK(soff + size_t(sb - sa + 1) * sbytes <= m.half, "{}: chunk overflows the staging half", what);
        for (int64_t sr = sa; sr <= sb; ++sr)
          std::memcpy(h + soff + size_t(sr - sa) * sbytes, sbase + size_t(sr * SC + sca) * size_t(ssz), sbytes);
        used = soff + size_t(sb - sa + 1) * sbytes;
        w.scaled = true;
        w.scale_type = stype;
        w.scale_ld = nsc, w.srow0 = sa, w.scol0 = sca, w.block_rows = br, w.block_cols = bc;
        m.stored += int64_t(size_t(sb - sa + 1) * sbytes);
      }
      TREX_CHECK(used <= m.half, "{}: chunk overflows the staging half", what);
      m.stored += int64_t(size_t(b - a) * wbytes);
      uint8_t* d = m.dev + size_t(k) * m.half;
      TREX_CUDA(cudaMemcpyAsync(d, h, used, cudaMemcpyHostToDevice, nullptr));
      TREX_CUDA(cudaEventRecord(m.copied[k], nullptr));
      m.pending[k] = true;
      w.data = d;
      w.scale = d + soff;
      w.out = out + (a - r0) * out_ld + (ca - c0);
      w.out_ld = out_ld;
      cuda::dequant_window(w, m.tables, nullptr);
    }
  }
}

}  // namespace trex::dsv4gpu
