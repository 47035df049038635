#include "model/dsv4/released_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ckpt/safetensors.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/naming.h"
#include "model/dsv4/param_table.h"

namespace trex::dsv4 {

namespace {

// splitmix64: a fast, seedable stream (gigabytes of random codes for the load benchmark).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float normal() {  // Box-Muller from two uniforms
    const double u1 = (double(next() >> 11) + 0.5) / 9007199254740992.0, u2 = double(next() >> 11) / 9007199254740992.0;
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

uint64_t name_seed(const std::string& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : name) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

void fill_codes(uint8_t* p, size_t n, Rng& g, bool fp8) {
  size_t i = 0;
  while (i < n) {
    uint64_t v = g.next();
    for (int k = 0; k < 8 && i < n; ++k, v >>= 8) {
      const uint8_t c = uint8_t(v);
      if (fp8 && (c & 0x7f) == 0x7f) continue;  // NaN codes never appear in a checkpoint
      p[i++] = c;
    }
  }
}

void fill_scales(uint8_t* p, size_t n, Rng& g) {
  for (size_t i = 0; i < n; ++i) p[i] = uint8_t(118 + g.next() % 16);  // 2^-9 .. 2^6
}

}  // namespace

ReleasedStorage released_storage(const std::string& n, const Shape& s, DType dtype) {
  if (dtype == DType::I64) return ReleasedStorage::I32;
  ExpertKey ek;
  if (parse_official_expert_key(n, &ek) && s.size() == 2 && s[1] % 32 == 0) return ReleasedStorage::Fp4Packed;
  if (keeps_fp32(n)) return ReleasedStorage::F32;
  if (s.size() == 2 && n.ends_with(".weight") && n != "embed.weight" && n != "head.weight" &&
      n.find("norm") == std::string::npos && !n.ends_with(".gate.weight"))
    return ReleasedStorage::Fp8Block;
  return ReleasedStorage::Bf16;
}

int64_t released_bytes(const std::string& name, const Shape& shape, DType dtype, int64_t block) {
  const int64_t n = numel(shape);
  switch (released_storage(name, shape, dtype)) {
    case ReleasedStorage::Fp8Block:
      return n + ((shape[0] + block - 1) / block) * ((shape[1] + block - 1) / block);
    case ReleasedStorage::Fp4Packed:
      return n / 2 + n / 32;
    case ReleasedStorage::Bf16:
      return 2 * n;
    case ReleasedStorage::F32:
    case ReleasedStorage::I32:
      return 4 * n;
  }
  return 0;
}

void write_random_released(const std::filesystem::path& dir, const ModelConfig& cfg, int64_t block, uint64_t seed,
                           size_t max_shard_bytes) {
  TREX_CHECK(block > 0, "released format: block size {} must be positive", block);
  std::filesystem::create_directories(dir);
  std::vector<ckpt::TensorToWrite> out;
  const int64_t E = cfg.n_routed_experts;
  for (const ExpectedTensor& e : expected_tensors(cfg)) {
    const std::string name = e.name;
    const Shape shape = e.shape;
    const uint64_t s0 = name_seed(name, seed);
    const std::string scale = name.ends_with(".weight") ? name.substr(0, name.size() - 7) + ".scale" : name + ".scale";
    switch (released_storage(name, shape, e.dtype)) {
      case ReleasedStorage::I32:
        out.push_back({name, DType::I32, shape, nullptr, [s0, E, n = size_t(numel(shape))](void* dst) {
                         Rng g{s0};
                         for (size_t i = 0; i < n; ++i) static_cast<int32_t*>(dst)[i] = int32_t(g.next() % uint64_t(E));
                       }});
        break;
      case ReleasedStorage::Fp4Packed: {
        const int64_t r = shape[0], c = shape[1];
        out.push_back({name, DType::I8, {r, c / 2}, nullptr, [s0, n = size_t(r * c / 2)](void* dst) {
                         Rng g{s0};
                         fill_codes(static_cast<uint8_t*>(dst), n, g, false);
                       }});
        out.push_back({scale, DType::F8_E8M0, {r, c / 32}, nullptr, [s0, n = size_t(r * c / 32)](void* dst) {
                         Rng g{s0 ^ 1};
                         fill_scales(static_cast<uint8_t*>(dst), n, g);
                       }});
        break;
      }
      case ReleasedStorage::Fp8Block: {
        const int64_t r = shape[0], c = shape[1], sr = (r + block - 1) / block, sc = (c + block - 1) / block;
        out.push_back({name, DType::F8_E4M3, shape, nullptr, [s0, n = size_t(r * c)](void* dst) {
                         Rng g{s0};
                         fill_codes(static_cast<uint8_t*>(dst), n, g, true);
                       }});
        out.push_back({scale, DType::F8_E8M0, {sr, sc}, nullptr, [s0, n = size_t(sr * sc)](void* dst) {
                         Rng g{s0 ^ 1};
                         fill_scales(static_cast<uint8_t*>(dst), n, g);
                       }});
        break;
      }
      case ReleasedStorage::Bf16:
      case ReleasedStorage::F32: {
        const DType dt = released_storage(name, shape, e.dtype) == ReleasedStorage::F32 ? DType::F32 : DType::BF16;
        const bool norm = name.find("norm") != std::string::npos;
        out.push_back({name, dt, shape, nullptr, [s0, dt, norm, n = size_t(numel(shape))](void* dst) {
                         Rng g{s0};
                         constexpr size_t kChunk = 4096;
                         float tmp[kChunk];
                         for (size_t i = 0; i < n; i += kChunk) {
                           const size_t k = std::min(kChunk, n - i);
                           for (size_t j = 0; j < k; ++j) tmp[j] = norm ? 1.f + 0.1f * g.normal() : 0.5f * g.normal();
                           convert_from_f32(tmp, dt, static_cast<uint8_t*>(dst) + i * size_t(dtype_bits(dt) / 8), k);
                         }
                       }});
        break;
      }
    }
  }
  ckpt::write_safetensors_sharded(dir, out, max_shard_bytes);
  nlohmann::json j = model_config_to_json(cfg, Dialect::Official);
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"scale_fmt", "ue8m0"},
                              {"activation_scheme", "dynamic"}, {"weight_block_size", {block, block}}};
  write_json_atomic(dir / "config.json", j, 2);
}

}  // namespace trex::dsv4
