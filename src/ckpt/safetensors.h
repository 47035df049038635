// safetensors files: a memory-mapped, strictly validated reader (one file, or a sharded directory
// with model.safetensors.index.json) and an atomic writer (one file, or shards plus index).
//
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:[b, e]},
// "__metadata__": {str: str}}, then the data buffer; offsets are relative to the buffer. The reader
// accepts exactly what the reference implementation accepts: tensors tile the buffer in offset order
// with no gaps or overlaps, each span is dtype x shape bytes, and the buffer ends at the end of file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/files.h"
#include "core/tensor.h"

namespace trex::ckpt {

// One tensor's header entry.
struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  size_t begin = 0;  // byte offsets into the data buffer
  size_t end = 0;
  size_t nbytes() const { return end - begin; }
};

// One memory-mapped .safetensors file. Views point into the read-only mapping: never write through them.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const fs::path& path);  // validates the whole header; throws trex::Error
  const fs::path& path() const { return map_.path(); }
  const std::vector<TensorEntry>& entries() const { return entries_; }  // in offset order
  const TensorEntry* find(std::string_view name) const;                 // nullptr when absent
  TensorView view(const TensorEntry& e) const;
  const json& metadata() const { return metadata_; }  // "__metadata__" object (empty if none)
  size_t header_bytes() const { return header_len_; }

 private:
  MappedFile map_;
  size_t header_len_ = 0;
  std::vector<TensorEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;
  json metadata_ = json::object();
};

// A checkpoint made of one or more safetensors files. Accepts
//  - a .safetensors file,
//  - a directory with model.safetensors.index.json (weight_map: name -> shard file), or
//  - a directory with model.safetensors (or exactly one *.safetensors file).
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const fs::path& file_or_dir);
  const fs::path& root() const { return root_; }
  bool sharded() const { return sharded_; }
  size_t size() const { return where_.size(); }
  std::vector<std::string> names() const;  // sorted
  bool contains(std::string_view name) const { return where_.find(name) != where_.end(); }
  const TensorEntry& entry(std::string_view name) const;  // throws naming the tensor and the checkpoint
  TensorView view(std::string_view name) const;           // pointer into the mapping (read-only)
  const fs::path& file_of(std::string_view name) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  size_t total_bytes() const;  // sum of tensor data bytes

 private:
  void add_file(const fs::path& path);
  fs::path root_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<size_t, const TensorEntry*>, std::less<>> where_;  // name -> (file, entry)
};

// A tensor to write: either `data` (exactly dtype_bytes(dtype, numel(shape)) bytes) or `produce`, called
// with a buffer of that size when the tensor is written (lets callers convert one tensor at a time).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
  std::function<void(void* dst)> produce;
  size_t nbytes() const { return dtype_bytes(dtype, size_t(numel(shape))); }
};

// Writes one file atomically; tensors are laid out in the order given; header padded with spaces to
// a multiple of 8 bytes. Metadata defaults to {"format": "pt"}.
void write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                       const json& metadata = json{{"format", "pt"}});

// Writes `tensors` into `dir` split into shards of at most `max_shard_bytes` of tensor data (a tensor
// larger than the limit gets a shard of its own). One shard -> `<prefix>.safetensors` and no index;
// several -> `<prefix>-00001-of-0000N.safetensors` + `<prefix>.safetensors.index.json` with
// metadata.total_size and weight_map. Stale files of an earlier export with the same prefix are removed.
// Returns the files written (relative names).
// `buffer_peak` (optional): set to the largest host buffer the writer allocated for a producer's tensor (0 when
// every tensor came as `data`); the writer holds no other tensor data.
std::vector<std::string> write_safetensors_sharded(const fs::path& dir,
                                                   const std::vector<TensorToWrite>& tensors,
                                                   size_t max_shard_bytes,
                                                   const std::string& prefix = "model",
                                                   size_t* buffer_peak = nullptr);

// Greedy in-order shard assignment used by the sharded writer: returns shard index per tensor.
std::vector<size_t> plan_shards(const std::vector<size_t>& tensor_bytes, size_t max_shard_bytes);

}  // namespace trex::ckpt
