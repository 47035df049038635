#include "model/dsv4/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"

namespace trex::dsv4 {

namespace {

constexpr int64_t kFp4Block = 32;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}
bool is_int(DType t) {
  return t == DType::I64 || t == DType::I32 || t == DType::I16 || t == DType::U8;
}

std::vector<float> scale_to_f32(const void* scale, DType dt, size_t n, const std::string& what) {
  TREX_CHECK(dt == DType::F8_E8M0 || dt == DType::F32 || dt == DType::BF16 || dt == DType::F16,
             "{}: scale dtype {} is not E8M0, F32, BF16 or F16", what, dtype_name(dt));
  std::vector<float> s(n);
  convert_to_f32(dt, scale, s.data(), n);
  return s;
}

// Large element-wise conversions in parallel chunks.
void convert_parallel(DType dt, const void* src, float* dst, size_t count) {
  constexpr size_t kChunk = size_t(1) << 20;
  if (count <= kChunk || dt == DType::F4_E2M1) {
    convert_to_f32(dt, src, dst, count);
    return;
  }
  const size_t esize = size_t(dtype_bits(dt) / 8);
  const int64_t n_chunks = int64_t((count + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < n_chunks; ++c) {
    size_t b = size_t(c) * kChunk, e = std::min(count, b + kChunk);
    convert_to_f32(dt, static_cast<const uint8_t*>(src) + b * esize, dst + b, e - b);
  }
}

// Sort key that orders "layers.10" after "layers.9" so shards hold whole consecutive layers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(uint8_t(a[i])) && std::isdigit(uint8_t(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && std::isdigit(uint8_t(a[i2]))) ++i2;
      while (j2 < b.size() && std::isdigit(uint8_t(b[j2]))) ++j2;
      std::string na = a.substr(i, i2 - i), nb = b.substr(j, j2 - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  for (ParamSpec& p : param_table(c))
    out.push_back({std::move(p.name), std::move(p.shape), p.kind == ParamKind::HashTable ? DType::I64 : DType::F32});
  return out;
}

// ---------------------------------------------------------------------------------------------
// De-quantisation
// ---------------------------------------------------------------------------------------------

void dequant_fp8_block(const uint8_t* w, int64_t rows, int64_t cols, const void* scale, DType scale_dtype,
                       int64_t block, float* out) {
  const int64_t sr = (rows + block - 1) / block, sc = (cols + block - 1) / block;
  std::vector<float> s = scale_to_f32(scale, scale_dtype, size_t(sr * sc), "FP8 block scale");
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    const float* srow = s.data() + (i / block) * sc;
    const uint8_t* wr = w + i * cols;
    float* o = out + i * cols;
    for (int64_t j = 0; j < cols; ++j) o[j] = fp8_e4m3_to_f32(wr[j]) * srow[j / block];
  }
}

void dequant_fp4_packed(const uint8_t* packed, int64_t rows, int64_t cols, const void* scale,
                        DType scale_dtype, float* out) {
  TREX_CHECK(cols % 2 == 0, "FP4 packed weight needs an even number of columns, found {}", cols);
  const int64_t sc = (cols + kFp4Block - 1) / kFp4Block;
  std::vector<float> s = scale_to_f32(scale, scale_dtype, size_t(rows * sc), "FP4 scale");
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    const uint8_t* pr = packed + i * (cols / 2);
    const float* srow = s.data() + i * sc;
    float* o = out + i * cols;
    for (int64_t k = 0; k < cols / 2; ++k) {
      const uint8_t byte = pr[k];
      o[2 * k] = fp4_e2m1_to_f32(byte & 0xf) * srow[(2 * k) / kFp4Block];
      o[2 * k + 1] = fp4_e2m1_to_f32(byte >> 4) * srow[(2 * k + 1) / kFp4Block];
    }
  }
}

// ---------------------------------------------------------------------------------------------
// CheckpointReader
// ---------------------------------------------------------------------------------------------

CheckpointReader::CheckpointReader(const fs::path& path, int64_t block_size)
    : st_(std::make_unique<ckpt::SafetensorsReader>(path)) {
  const std::string where = path.string();
  block_ = block_size;
  if (block_ == 0) {
    block_ = 128;
    fs::path cfg = fs::is_directory(path) ? path / "config.json" : path.parent_path() / "config.json";
    if (fs::exists(cfg)) {
      json j = read_json_file(cfg);
      if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
        const json& q = j["quantization_config"];
        if (q.contains("weight_block_size")) {
          const json& b = q["weight_block_size"];
          TREX_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[0] == b[1] &&
                         b[0].get<int64_t>() > 0,
                     "{}: quantization_config.weight_block_size must be [B, B] with B > 0, found {}",
                     cfg.string(), b.dump());
          block_ = b[0].get<int64_t>();
        }
      }
    }
  }

  std::vector<std::string> stored = st_->names();
  naming_ = detect_naming(stored);

  // 1. Stored key -> official key (or stacked-expert slices).
  std::map<std::string, std::string> official_of;  // official -> stored
  for (const auto& s : stored) {
    if (naming_ == Naming::Transformers) {
      int64_t layer = 0;
      bool gate_up = false;
      if (parse_transformers_stacked_key(s, &layer, &gate_up)) {
        const ckpt::TensorEntry& e = st_->entry(s);
        TREX_CHECK(e.shape.size() == 3 && is_float(e.dtype),
                   "{}: tensor '{}' must be a float [experts, rows, cols] stack, found {} {}", where, s,
                   dtype_name(e.dtype), shape_str(e.shape));
        const int64_t E = e.shape[0], rows = e.shape[1], cols = e.shape[2];
        TREX_CHECK(!gate_up || rows % 2 == 0, "{}: tensor '{}' {}: gate_up rows must be even (gate, then up)",
                   where, s, shape_str(e.shape));
        const std::string block = "layers." + std::to_string(layer);
        for (int64_t x = 0; x < E; ++x) {
          const size_t base = size_t(x * rows * cols);
          if (gate_up) {
            const int64_t f = rows / 2;
            sources_[official_expert_key(block, x, 1)] = {
                TensorSource::Kind::StackedSlice, s, "", {f, cols}, base};
            sources_[official_expert_key(block, x, 3)] = {
                TensorSource::Kind::StackedSlice, s, "", {f, cols}, base + size_t(f * cols)};
          } else {
            sources_[official_expert_key(block, x, 2)] = {
                TensorSource::Kind::StackedSlice, s, "", {rows, cols}, base};
          }
        }
        continue;
      }
      try {
        official_of[transformers_to_official(s)] = s;
      } catch (const Error&) {
        unrecognised_.push_back(s);
      }
    } else {
      official_of[s] = s;
    }
  }

  // 2. Fold scales into their weights and classify the storage.
  for (const auto& [official, s] : official_of) {
    if (ends_with(official, ".scale")) {
      std::string weight = official.substr(0, official.size() - 6) + ".weight";
      if (!official_of.count(weight)) unrecognised_.push_back(s);  // a scale without its weight
      continue;
    }
    const ckpt::TensorEntry& e = st_->entry(s);
    TensorSource src;
    src.stored = s;
    src.shape = e.shape;
    std::string scale_key;
    if (ends_with(official, ".weight")) {
      auto it = official_of.find(official.substr(0, official.size() - 7) + ".scale");
      if (it != official_of.end()) scale_key = it->second;
    }
    if (e.dtype == DType::F8_E4M3) {
      TREX_CHECK(!scale_key.empty(), "{}: FP8 tensor '{}' has no scale tensor ('{}')", where, s,
                 naming_ == Naming::Official ? official.substr(0, official.size() - 7) + ".scale"
                                             : s.substr(0, s.size() - 7) + ".weight_scale_inv");
      TREX_CHECK(e.shape.size() == 2, "{}: FP8 tensor '{}' must be 2-D, found {}", where, s,
                 shape_str(e.shape));
      const ckpt::TensorEntry& se = st_->entry(scale_key);
      Shape want = {(e.shape[0] + block_ - 1) / block_, (e.shape[1] + block_ - 1) / block_};
      TREX_CHECK(se.shape == want,
                 "{}: scale '{}' of FP8 tensor '{}' {} has shape {}; expected {} for {}x{} blocks", where,
                 scale_key, s, shape_str(e.shape), shape_str(se.shape), shape_str(want), block_, block_);
      src.kind = TensorSource::Kind::Fp8Block;
      src.scale = scale_key;
    } else if (!scale_key.empty() &&
               (e.dtype == DType::I8 || e.dtype == DType::U8 || e.dtype == DType::F4_E2M1)) {
      TREX_CHECK(e.shape.size() == 2, "{}: FP4 tensor '{}' must be 2-D, found {}", where, s,
                 shape_str(e.shape));
      // int8 storage holds two elements per byte; an F4 dtype already counts logical elements.
      const int64_t cols = e.dtype == DType::F4_E2M1 ? e.shape[1] : 2 * e.shape[1];
      src.shape = {e.shape[0], cols};
      const ckpt::TensorEntry& se = st_->entry(scale_key);
      Shape want = {e.shape[0], (cols + kFp4Block - 1) / kFp4Block};
      TREX_CHECK(se.shape == want,
                 "{}: scale '{}' of FP4 tensor '{}' (logical {}) has shape {}; expected {} for 1x{} blocks",
                 where, scale_key, s, shape_str(src.shape), shape_str(se.shape), shape_str(want), kFp4Block);
      src.kind = TensorSource::Kind::Fp4Packed;
      src.scale = scale_key;
    } else {
      TREX_CHECK(scale_key.empty(), "{}: tensor '{}' has a scale '{}' but its dtype {} is not quantised",
                 where, s, scale_key, dtype_name(e.dtype));
      TREX_CHECK(is_float(e.dtype) || is_int(e.dtype), "{}: tensor '{}' has dtype {} without a scale", where,
                 s, dtype_name(e.dtype));
    }
    sources_[official] = std::move(src);
  }
}

std::vector<std::string> CheckpointReader::official_names() const {
  std::vector<std::string> out;
  for (const auto& [n, s] : sources_) out.push_back(n);
  return out;
}

const TensorSource& CheckpointReader::source(const std::string& official) const {
  auto it = sources_.find(official);
  TREX_CHECK(it != sources_.end(), "{}: no tensor '{}' (official name) in this checkpoint",
             st_->root().string(), official);
  return it->second;
}

HostTensor CheckpointReader::load(const std::string& official) const {
  const TensorSource& src = source(official);
  const TensorView v = st_->view(src.stored);
  switch (src.kind) {
    case TensorSource::Kind::Plain: {
      if (is_int(v.dtype)) {
        HostTensor t(DType::I64, src.shape);
        int64_t* o = t.view.as<int64_t>();
        const size_t n = size_t(t.numel());
        for (size_t i = 0; i < n; ++i) {
          switch (v.dtype) {
            case DType::I64:
              o[i] = v.as<const int64_t>()[i];
              break;
            case DType::I32:
              o[i] = v.as<const int32_t>()[i];
              break;
            case DType::I16:
              o[i] = v.as<const int16_t>()[i];
              break;
            default:
              o[i] = v.as<const uint8_t>()[i];
              break;
          }
        }
        return t;
      }
      HostTensor t(DType::F32, src.shape);
      convert_parallel(v.dtype, v.data, t.f32(), size_t(t.numel()));
      return t;
    }
    case TensorSource::Kind::StackedSlice: {
      HostTensor t(DType::F32, src.shape);
      const size_t esize = size_t(dtype_bits(v.dtype) / 8);
      convert_parallel(v.dtype, static_cast<const uint8_t*>(v.data) + src.element_offset * esize, t.f32(),
                       size_t(t.numel()));
      return t;
    }
    case TensorSource::Kind::Fp8Block: {
      const TensorView s = st_->view(src.scale);
      HostTensor t(DType::F32, src.shape);
      dequant_fp8_block(v.as<const uint8_t>(), src.shape[0], src.shape[1], s.data, s.dtype, block_, t.f32());
      return t;
    }
    case TensorSource::Kind::Fp4Packed: {
      const TensorView s = st_->view(src.scale);
      HostTensor t(DType::F32, src.shape);
      dequant_fp4_packed(v.as<const uint8_t>(), src.shape[0], src.shape[1], s.data, s.dtype, t.f32());
      return t;
    }
  }
  TREX_ASSERT(false);
}

// ---------------------------------------------------------------------------------------------
// load_state_dict
// ---------------------------------------------------------------------------------------------

StateDict load_state_dict(const fs::path& model_dir, const ModelConfig& cfg, const LoadOptions& opts) {
  const std::string where = model_dir.string();
  CheckpointReader reader(model_dir, opts.block_size);
  auto wanted = [&](const std::string& n) { return !opts.filter || opts.filter(n); };

  std::vector<ExpectedTensor> expected;
  std::set<std::string> expected_names;
  for (auto& e : expected_tensors(cfg)) {
    if (!wanted(e.name)) continue;
    expected_names.insert(e.name);
    expected.push_back(std::move(e));
  }

  std::vector<std::string> missing;
  for (const auto& e : expected)
    if (!reader.has(e.name)) missing.push_back(e.name + " " + shape_str(e.shape));
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) list += "\n  " + missing[i];
    fail("{} ({} naming): {} tensor(s) the config needs are missing:{}{}", where,
         naming_name(reader.naming()), missing.size(), list, missing.size() > 8 ? "\n  ..." : "");
  }
  std::vector<std::string> unexpected;
  for (const auto& n : reader.official_names())
    if (wanted(n) && !expected_names.count(n)) unexpected.push_back(n);
  for (const auto& s : reader.unrecognised()) unexpected.push_back(s + " (stored name)");
  if (!unexpected.empty()) {
    std::string list;
    for (size_t i = 0; i < unexpected.size() && i < 8; ++i) list += "\n  " + unexpected[i];
    std::string msg = fmt::format("{} ({} naming): {} tensor(s) the config does not account for:{}{}", where,
                                  naming_name(reader.naming()), unexpected.size(), list,
                                  unexpected.size() > 8 ? "\n  ..." : "");
    if (!opts.allow_unexpected) fail("{}", msg);
    log::warn("{} (skipped)", msg);
  }

  int64_t total = 0;
  for (const auto& e : expected) {
    const Shape& got = reader.shape(e.name);
    const TensorSource& src = reader.source(e.name);
    TREX_CHECK(got == e.shape,
               "{}: tensor '{}' (stored as '{}' in {}): expected shape {} from the config, found {}", where,
               e.name, src.stored, reader.files().file_of(src.stored).filename().string(), shape_str(e.shape),
               shape_str(got));
    total += numel(e.shape);
  }

  std::unique_ptr<ProgressBar> progress;
  if (total >= (int64_t(1) << 28)) progress = std::make_unique<ProgressBar>("load " + where, total, "el");
  StateDict state;
  int64_t done = 0;
  for (const auto& e : expected) {
    HostTensor t = reader.load(e.name);
    if (e.dtype == DType::I64) {
      TREX_CHECK(t.view.dtype == DType::I64, "{}: tensor '{}' must be an integer table, found a float tensor",
                 where, e.name);
      const int64_t* ids = t.view.as<int64_t>();
      for (int64_t i = 0; i < t.numel(); ++i)
        TREX_CHECK(ids[i] >= 0 && ids[i] < cfg.n_routed_experts,
                   "{}: tensor '{}' entry {} is expert {}, outside [0, {})", where, e.name, i, ids[i],
                   cfg.n_routed_experts);
    } else {
      TREX_CHECK(t.view.dtype == DType::F32,
                 "{}: tensor '{}' must be floating point, found an integer tensor", where, e.name);
    }
    done += t.numel();
    state.emplace(e.name, std::move(t));
    if (progress) progress->update(done);
  }
  if (progress) progress->finish();
  return state;
}

// ---------------------------------------------------------------------------------------------
// save_state_dict
// ---------------------------------------------------------------------------------------------

ExportStats save_model_streaming(const fs::path& dir, const ModelConfig& cfg, const TensorFeed& feed, Dialect dialect,
                                 DType dtype, size_t max_shard_bytes) {
  const auto t0 = std::chrono::steady_clock::now();
  // The largest fp32 buffer a producer below allocates (it holds one fed tensor while converting it).
  auto feed_peak = std::make_shared<size_t>(0);
  TREX_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
             "{}: export dtype must be F32, BF16 or F16, not {}", dir.string(), dtype_name(dtype));
  std::map<std::string, ExpectedTensor> expected;
  for (const auto& e : expected_tensors(cfg)) expected.emplace(e.name, e);
  std::vector<std::string> order;
  for (const auto& [n, e] : expected) order.push_back(n);
  std::sort(order.begin(), order.end(), natural_less);

  // A float tensor fed in fp32 and converted into the writer's buffer (fed straight into it when F32).
  auto converted = [&feed, feed_peak](const ExpectedTensor& e, DType dt) {
    return [&feed, feed_peak, e, dt](void* dst) {
      if (dt == DType::F32) return feed(e.name, e.shape, DType::F32, dst);
      std::vector<float> tmp(size_t(numel(e.shape)));
      *feed_peak = std::max(*feed_peak, tmp.size() * sizeof(float));
      feed(e.name, e.shape, DType::F32, tmp.data());
      convert_from_f32(tmp.data(), dt, dst, tmp.size());
    };
  };

  std::vector<ckpt::TensorToWrite> tensors;
  std::set<int64_t> stacked_layers;
  for (const auto& n : order) {
    const ExpectedTensor& t = expected.at(n);
    ExpertKey ek;
    if (dialect == Dialect::Transformers && parse_official_expert_key(n, &ek) &&
        ek.block.rfind("layers.", 0) == 0) {
      const int64_t layer = std::stoll(ek.block.substr(7));
      if (!stacked_layers.insert(layer).second) continue;  // one stack per layer, written at its first expert
      const int64_t E = cfg.n_routed_experts, f = cfg.moe_inter, d = cfg.hidden;
      const DType dt = dtype;
      // The stack [E, 2f, d] (w1 rows then w3 rows per expert) / [E, d, f], filled one expert tensor at a time.
      auto stack = [&feed, feed_peak, block = ek.block, dt, E, f, d](std::vector<int> parts) {
        return [&feed, feed_peak, block, dt, E, f, d, parts](void* dst) {
          const size_t esz = size_t(dtype_bits(dt) / 8), n = size_t(f * d);
          std::vector<float> tmp(n);
          *feed_peak = std::max(*feed_peak, n * sizeof(float));
          auto* o = static_cast<uint8_t*>(dst);
          size_t at = 0;
          for (int64_t e = 0; e < E; ++e)
            for (int w : parts) {
              const std::string name = official_expert_key(block, e, w);
              feed(name, w == 2 ? Shape{d, f} : Shape{f, d}, DType::F32, tmp.data());
              convert_from_f32(tmp.data(), dt, o + at * esz, n);
              at += n;
            }
        };
      };
      ckpt::TensorToWrite gu{transformers_gate_up_key(layer), dt, {E, 2 * f, d}, nullptr, stack({1, 3})};
      ckpt::TensorToWrite dn{transformers_down_key(layer), dt, {E, d, f}, nullptr, stack({2})};
      tensors.push_back(std::move(gu));
      tensors.push_back(std::move(dn));
      continue;
    }
    const std::string out_name = dialect == Dialect::Transformers ? official_to_transformers(n) : n;
    if (t.dtype == DType::I64) {
      ckpt::TensorToWrite w{out_name, DType::I64, t.shape, nullptr, {}};
      w.produce = [&feed, t](void* dst) { feed(t.name, t.shape, DType::I64, dst); };
      tensors.push_back(std::move(w));
      continue;
    }
    const DType dt = keeps_fp32(n) ? DType::F32 : dtype;
    tensors.push_back({out_name, dt, t.shape, nullptr, converted(t, dt)});
  }

  size_t buffer_peak = 0;
  ckpt::write_safetensors_sharded(dir, tensors, max_shard_bytes, "model", &buffer_peak);
  json config = model_config_to_json(cfg, dialect);
  config["torch_dtype"] = dtype == DType::F32 ? "float32" : dtype == DType::BF16 ? "bfloat16" : "float16";
  write_json_atomic(dir / "config.json", config, 2);
  ExportStats st;
  st.tensors = int64_t(tensors.size());
  for (const auto& t : tensors) st.bytes += int64_t(t.nbytes());
  st.host_peak_bytes = int64_t(buffer_peak + *feed_peak);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

void save_state_dict(const fs::path& dir, const StateDict& state, const ModelConfig& cfg, Dialect dialect,
                     DType dtype, size_t max_shard_bytes) {
  // The state must be exactly what the config implies, in shape and kind.
  std::set<std::string> expected_names;
  for (const auto& e : expected_tensors(cfg)) {
    expected_names.insert(e.name);
    auto it = state.find(e.name);
    TREX_CHECK(it != state.end(), "{}: cannot export: state has no tensor '{}' {}", dir.string(), e.name,
               shape_str(e.shape));
    TREX_CHECK(it->second.shape() == e.shape,
               "{}: cannot export tensor '{}': expected shape {} from the config, found {}", dir.string(),
               e.name, shape_str(e.shape), shape_str(it->second.shape()));
    TREX_CHECK(it->second.view.dtype == e.dtype, "{}: cannot export tensor '{}': expected dtype {}, found {}",
               dir.string(), e.name, dtype_name(e.dtype), dtype_name(it->second.view.dtype));
  }
  for (const auto& [n, t] : state)
    TREX_CHECK(expected_names.count(n), "{}: cannot export: tensor '{}' is not part of this config",
               dir.string(), n);
  const TensorFeed feed = [&state](const std::string& name, const Shape&, DType dt, void* dst) {
    const HostTensor& t = state.at(name);
    std::memcpy(dst, t.view.data, size_t(t.numel()) * (dt == DType::I64 ? sizeof(int64_t) : sizeof(float)));
  };
  save_model_streaming(dir, cfg, feed, dialect, dtype, max_shard_bytes);
}

}  // namespace trex::dsv4
