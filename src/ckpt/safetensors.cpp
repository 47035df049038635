#include "ckpt/safetensors.h"

#include <algorithm>
#include <cstring>
#include <regex>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"

namespace trex::ckpt {

namespace {

// Headers beyond this are refused (the reference implementation's limit), so a corrupt length
// cannot make us parse gigabytes of tensor data as JSON.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Largest accepted element count: keeps numel * bits far from 64-bit overflow.
constexpr uint64_t kMaxElements = 1ull << 56;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_u64_le(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = uint8_t(v >> (8 * i));
}

uint64_t json_uint(const json& v, const std::string& file, const std::string& tensor, const char* what) {
  TREX_CHECK(v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0),
             "{}: tensor '{}': {} must be non-negative integers, found {}", file, tensor, what, v.dump());
  return v.get<uint64_t>();
}

TensorEntry parse_entry(const std::string& file, const std::string& name, const json& v) {
  TREX_CHECK(v.is_object(), "{}: tensor '{}': header entry must be an object, found {}", file, name,
             v.dump());
  TensorEntry e;
  e.name = name;
  auto dt = v.find("dtype");
  TREX_CHECK(dt != v.end() && dt->is_string(), "{}: tensor '{}': missing or non-string 'dtype'", file, name);
  TREX_CHECK(
      dtype_from_name(dt->get<std::string>(), &e.dtype),
      "{}: tensor '{}': unknown dtype '{}' (supported: F64 F32 F16 BF16 F8_E4M3 F8_E8M0 F4_E2M1 I64 I32 "
      "I16 I8 U8 BOOL)",
      file, name, dt->get<std::string>());
  auto sh = v.find("shape");
  TREX_CHECK(sh != v.end() && sh->is_array(), "{}: tensor '{}': missing or non-array 'shape'", file, name);
  uint64_t count = 1;
  for (const auto& d : *sh) {
    uint64_t n = json_uint(d, file, name, "shape entries");
    TREX_CHECK(n <= kMaxElements && (n == 0 || count <= kMaxElements / n),
               "{}: tensor '{}': shape {} is too large", file, name, sh->dump());
    count *= n;
    e.shape.push_back(int64_t(n));
  }
  auto off = v.find("data_offsets");
  TREX_CHECK(off != v.end() && off->is_array() && off->size() == 2,
             "{}: tensor '{}': 'data_offsets' must be an array [begin, end]", file, name);
  e.begin = json_uint((*off)[0], file, name, "data_offsets");
  e.end = json_uint((*off)[1], file, name, "data_offsets");
  TREX_CHECK(e.end >= e.begin, "{}: tensor '{}': data_offsets [{}, {}] go backwards", file, name, e.begin,
             e.end);
  size_t expect = dtype_bytes(e.dtype, size_t(count));
  TREX_CHECK(e.end - e.begin == expect,
             "{}: tensor '{}': data_offsets [{}, {}] span {} bytes but dtype {} x shape {} needs {} bytes",
             file, name, e.begin, e.end, e.end - e.begin, dtype_name(e.dtype), shape_str(e.shape), expect);
  return e;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SafetensorsFile
// ---------------------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(const fs::path& path) : map_(path) {
  const std::string file = path.string();
  const size_t size = map_.size();
  TREX_CHECK(size >= 8, "{}: truncated safetensors file: {} bytes, need at least 8 for the header length",
             file, size);
  uint64_t n = read_u64_le(map_.data());
  TREX_CHECK(n <= size - 8, "{}: header length {} runs past the end of the file ({} bytes)", file, n, size);
  TREX_CHECK(n <= kMaxHeaderBytes, "{}: header length {} exceeds the {} byte limit", file, n,
             kMaxHeaderBytes);
  header_len_ = size_t(n);
  std::string_view text(reinterpret_cast<const char*>(map_.data() + 8), header_len_);

  // Duplicate top-level names would silently overwrite each other in the DOM: catch them while parsing.
  std::string duplicate;
  std::set<std::string> seen;
  json header;
  try {
    header = json::parse(text, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (ev == json::parse_event_t::key && depth == 1) {
        std::string k = parsed.get<std::string>();
        if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
      }
      return true;
    });
  } catch (const json::parse_error& e) {
    fail("{}: invalid header JSON (header is {} bytes): {}", file, header_len_, e.what());
  }
  TREX_CHECK(duplicate.empty(), "{}: tensor '{}' appears more than once in the header", file, duplicate);
  TREX_CHECK(header.is_object(), "{}: header JSON must be an object, found {}", file, header.type_name());

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      TREX_CHECK(it->is_object(), "{}: __metadata__ must be an object", file);
      metadata_ = *it;
      continue;
    }
    entries_.push_back(parse_entry(file, it.key(), *it));
  }
  std::sort(entries_.begin(), entries_.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });

  // The tensors must tile the data buffer exactly: no overlap, no gap, nothing past the end.
  const size_t data_size = size - 8 - header_len_;
  size_t pos = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& e : entries_) {
    TREX_CHECK(
        e.end <= data_size,
        "{}: tensor '{}': data_offsets [{}, {}] go past the end of the data ({} bytes; file truncated?)",
        file, e.name, e.begin, e.end, data_size);
    TREX_CHECK(e.begin >= pos, "{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' (ends at {})",
               file, e.name, e.begin, e.end, prev ? prev->name : "", pos);
    TREX_CHECK(e.begin == pos,
               "{}: tensor '{}': data_offsets [{}, {}] leave a gap of {} bytes after offset {}", file, e.name,
               e.begin, e.end, e.begin - pos, pos);
    pos = e.end;
    prev = &e;
  }
  TREX_CHECK(pos == data_size,
             "{}: {} trailing bytes after the last tensor (data buffer {} bytes, tensors end at {})", file,
             data_size - pos, data_size, pos);
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].name, i);
}

const TensorEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

TensorView SafetensorsFile::view(const TensorEntry& e) const {
  TensorView v;
  v.dtype = e.dtype;
  v.shape = e.shape;
  v.data = const_cast<uint8_t*>(map_.data() + 8 + header_len_ + e.begin);
  return v;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsReader
// ---------------------------------------------------------------------------------------------

void SafetensorsReader::add_file(const fs::path& path) {
  files_.push_back(std::make_unique<SafetensorsFile>(path));
  size_t idx = files_.size() - 1;
  for (const auto& e : files_.back()->entries()) {
    auto [it, inserted] = where_.emplace(e.name, std::make_pair(idx, &e));
    TREX_CHECK(inserted, "{}: tensor '{}' is stored in both {} and {}", root_.string(), e.name,
               files_[it->second.first]->path().filename().string(), path.filename().string());
  }
}

SafetensorsReader::SafetensorsReader(const fs::path& file_or_dir) : root_(file_or_dir) {
  TREX_CHECK(fs::exists(root_), "{}: no such file or directory", root_.string());
  if (!fs::is_directory(root_)) {
    add_file(root_);
    return;
  }
  const fs::path index_path = root_ / "model.safetensors.index.json";
  if (!fs::exists(index_path)) {
    fs::path single = root_ / "model.safetensors";
    if (!fs::exists(single)) {
      std::vector<fs::path> found;
      for (const auto& de : fs::directory_iterator(root_))
        if (de.path().extension() == ".safetensors") found.push_back(de.path());
      TREX_CHECK(found.size() == 1,
                 "{}: no model.safetensors.index.json or model.safetensors, and {} other .safetensors files "
                 "(need exactly one)",
                 root_.string(), found.size());
      single = found[0];
    }
    add_file(single);
    return;
  }

  sharded_ = true;
  const std::string index_name = index_path.string();
  json index = read_json_file(index_path);
  TREX_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
             "{}: missing 'weight_map' object", index_name);
  const json& weight_map = index["weight_map"];
  std::map<std::string, std::vector<std::string>> by_shard;  // sorted: deterministic file order
  for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
    TREX_CHECK(it->is_string(), "{}: weight_map['{}'] must be a file name", index_name, it.key());
    by_shard[it->get<std::string>()].push_back(it.key());
  }
  for (const auto& [shard, tensors] : by_shard) {
    fs::path p = root_ / shard;
    TREX_CHECK(fs::exists(p), "{}: shard '{}' (holding tensor '{}' and {} more) does not exist", index_name,
               shard, tensors.front(), tensors.size() - 1);
    add_file(p);
    const SafetensorsFile& f = *files_.back();
    for (const auto& t : tensors)
      TREX_CHECK(f.find(t) != nullptr, "{}: tensor '{}' is mapped to shard '{}', which does not contain it",
                 index_name, t, shard);
  }
  size_t unlisted = where_.size() - weight_map.size();
  if (unlisted > 0)
    log::warn("{}: {} tensors in the shards are not listed in the weight_map (loaded anyway)", index_name,
              unlisted);
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, loc] : where_) out.push_back(name);
  return out;
}

const TensorEntry& SafetensorsReader::entry(std::string_view name) const {
  auto it = where_.find(name);
  TREX_CHECK(it != where_.end(), "{}: no tensor named '{}'", root_.string(), name);
  return *it->second.second;
}

TensorView SafetensorsReader::view(std::string_view name) const {
  auto it = where_.find(name);
  TREX_CHECK(it != where_.end(), "{}: no tensor named '{}'", root_.string(), name);
  return files_[it->second.first]->view(*it->second.second);
}

const fs::path& SafetensorsReader::file_of(std::string_view name) const {
  auto it = where_.find(name);
  TREX_CHECK(it != where_.end(), "{}: no tensor named '{}'", root_.string(), name);
  return files_[it->second.first]->path();
}

size_t SafetensorsReader::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, loc] : where_) n += loc.second->nbytes();
  return n;
}

// ---------------------------------------------------------------------------------------------
// Writers
// ---------------------------------------------------------------------------------------------

namespace {

void write_one(const fs::path& path, const std::vector<const TensorToWrite*>& tensors, const json& metadata,
               ProgressBar* progress, int64_t* progress_done, size_t* buffer_peak = nullptr) {
  json header = json::object();
  if (!metadata.is_null() && !metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const TensorToWrite* t : tensors) {
    TREX_CHECK(!header.contains(t->name), "{}: tensor '{}' given twice", path.string(), t->name);
    TREX_CHECK(t->data != nullptr || t->produce || t->nbytes() == 0,
               "{}: tensor '{}' has neither data nor a producer", path.string(), t->name);
    for (int64_t d : t->shape)
      TREX_CHECK(d >= 0, "{}: tensor '{}': negative dimension in {}", path.string(), t->name,
                 shape_str(t->shape));
    size_t n = t->nbytes();
    header[t->name] = {{"dtype", std::string(dtype_name(t->dtype))},
                       {"shape", t->shape},
                       {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data buffer starts 8-byte aligned
  write_file_atomic(path, [&](std::FILE* f) {
    uint8_t len[8];
    put_u64_le(len, text.size());
    TREX_CHECK(std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size(),
               "{}: short write", path.string());
    Buffer scratch;
    for (const TensorToWrite* t : tensors) {
      size_t n = t->nbytes();
      if (n == 0) continue;
      const void* src = t->data;
      if (!src) {
        if (scratch.size() < n) scratch = Buffer(n, false);
        if (buffer_peak) *buffer_peak = std::max(*buffer_peak, scratch.size());
        t->produce(scratch.data());
        src = scratch.data();
      }
      TREX_CHECK(std::fwrite(src, 1, n, f) == n, "{}: short write of tensor '{}'", path.string(), t->name);
      if (progress) {
        *progress_done += int64_t(n);
        progress->update(*progress_done);
      }
    }
  });
}

}  // namespace

void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const json& metadata) {
  std::vector<const TensorToWrite*> ptrs;
  for (const auto& t : tensors) ptrs.push_back(&t);
  write_one(path, ptrs, metadata, nullptr, nullptr);
}

std::vector<size_t> plan_shards(const std::vector<size_t>& tensor_bytes, size_t max_shard_bytes) {
  TREX_CHECK(max_shard_bytes > 0, "max shard size must be positive");
  std::vector<size_t> shard(tensor_bytes.size());
  size_t cur = 0, used = 0;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    if (used > 0 && used + tensor_bytes[i] > max_shard_bytes) {
      ++cur;
      used = 0;
    }
    shard[i] = cur;
    used += tensor_bytes[i];
  }
  return shard;
}

std::vector<std::string> write_safetensors_sharded(const fs::path& dir,
                                                   const std::vector<TensorToWrite>& tensors,
                                                   size_t max_shard_bytes, const std::string& prefix,
                                                   size_t* buffer_peak) {
  if (buffer_peak) *buffer_peak = 0;
  fs::create_directories(dir);
  std::vector<size_t> sizes;
  size_t total = 0;
  for (const auto& t : tensors) {
    sizes.push_back(t.nbytes());
    total += sizes.back();
  }
  std::vector<size_t> shard = plan_shards(sizes, max_shard_bytes);
  size_t n_shards = tensors.empty() ? 1 : shard.back() + 1;

  std::vector<std::vector<const TensorToWrite*>> groups(n_shards);
  for (size_t i = 0; i < tensors.size(); ++i) groups[shard[i]].push_back(&tensors[i]);
  std::vector<std::string> names;
  if (n_shards == 1) {
    names.push_back(prefix + ".safetensors");
  } else {
    for (size_t s = 0; s < n_shards; ++s)
      names.push_back(fmt::format("{}-{:05d}-of-{:05d}.safetensors", prefix, s + 1, n_shards));
  }

  // Big exports show progress; small ones (tests, tiny models) stay quiet.
  std::unique_ptr<ProgressBar> progress;
  if (total >= (256ull << 20))
    progress = std::make_unique<ProgressBar>("write " + dir.filename().string(), int64_t(total), "B");
  int64_t done = 0;
  json weight_map = json::object();
  for (size_t s = 0; s < n_shards; ++s) {
    write_one(dir / names[s], groups[s], json{{"format", "pt"}}, progress.get(), &done, buffer_peak);
    for (const auto* t : groups[s]) weight_map[t->name] = names[s];
  }
  if (progress) progress->finish();

  const fs::path index_path = dir / (prefix + ".safetensors.index.json");
  if (n_shards > 1)
    write_json_atomic(index_path, json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}, 2);

  // Remove what an earlier export with another shard count left behind, so readers see one checkpoint.
  std::error_code ec;
  if (n_shards == 1) fs::remove(index_path, ec);
  const std::regex shard_re(std::regex_replace(prefix, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)") +
                            R"(-\d{5}-of-\d{5}\.safetensors)");
  std::set<std::string> keep(names.begin(), names.end());
  if (n_shards > 1) fs::remove(dir / (prefix + ".safetensors"), ec);
  for (const auto& de : fs::directory_iterator(dir)) {
    std::string fname = de.path().filename().string();
    if (std::regex_match(fname, shard_re) && !keep.count(fname)) fs::remove(de.path(), ec);
  }
  return names;
}

}  // namespace trex::ckpt
