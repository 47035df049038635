// KV compressors of CSA / HCA layers (design §2.6) and the plan of compressed entries for one batch
// layout (windows aligned to each document's start, trailing partial windows dropped, §2.11).
//
// One entry per complete window of m tokens of a document. Per channel the entry is a softmax-gated
// sum over its candidates: the window's own tokens (values kv[.., off+ch], logits gate[.., off+ch] +
// ape[offset][off+ch], off = c for the overlapped CSA compressor, 0 for HCA) and, for the overlapped
// compressor only, the previous window of the same document (channels [0, c), with their own ape
// offsets; absent for a document's first window). Then a weighted RMSNorm and RoPE at the position of
// the window's first token. All arithmetic in T (no bf16 rounding).
#pragma once
#include <cstdint>
#include <vector>

#include "model/dsv4/rope.h"
#include "model/dsv4/seq_layout.h"

namespace trex::dsv4 {

template <typename T>
struct CompressorParamsT {
  T* wkv = nullptr;    // [width*c, d]   width = 2 (overlapped CSA) or 1 (HCA)
  T* wgate = nullptr;  // [width*c, d]
  T* ape = nullptr;    // [m, width*c]
  T* norm = nullptr;   // [c]
};

// Where the compressed entries of a batch are and which of them each token may see.
struct CompressPlan {
  int64_t ratio = 0;
  int64_t n_entries = 0;                 // E, over all rows; row b's entries are contiguous and in order
  std::vector<int64_t> entry_first;      // [E] global token index (b*T + t) of the window's first token
  std::vector<int64_t> entry_doc_index;  // [E] index of the window inside its document (0 = first)
  std::vector<int64_t> row_entry_begin;  // [B+1]
  std::vector<int64_t> tok_entry;        // [N] entry whose own window holds the token, -1 if none
  // [N] visible entries of token i: global entries [vis_begin[i], vis_end[i]) = the entries of its own
  // document whose whole window lies at or before it (design §2.6.3, per document).
  std::vector<int64_t> vis_begin, vis_end;
};

CompressPlan make_compress_plan(const SeqLayout& layout, int64_t ratio);

template <typename T>
struct CompressorSaved {
  std::vector<T> kv, gate;  // [N, width*c] projections of every token (gate without ape)
  std::vector<T> pooled;    // [E, c] before the norm
  std::vector<T> rstd;      // [E]
  size_t bytes() const { return (kv.size() + gate.size() + pooled.size() + rstd.size()) * sizeof(T); }
};

struct CompressorDims {
  int64_t d = 0;  // input width
  int64_t c = 0;  // entry width
  int64_t rope_dim = 0;
  bool overlap = false;
  double eps = 1e-6;
};

// out [E, c]: the compressed entries (normed, RoPE applied). `a` is [N, d].
template <typename T>
void compressor_forward(const CompressorParamsT<T>& p, const CompressorDims& dims, const CompressPlan& plan,
                        const SeqLayout& layout, const RopeTable<T>& rope, const T* a, T* out,
                        CompressorSaved<T>& saved);

// dout [E, c]. Accumulates into the gradient parameters of `g` and into da [N, d] (skipped when null,
// e.g. for the indexer's detached input).
template <typename T>
void compressor_backward(const CompressorParamsT<T>& p, const CompressorParamsT<T>& g,
                         const CompressorDims& dims, const CompressPlan& plan, const SeqLayout& layout,
                         const RopeTable<T>& rope, const T* a, const CompressorSaved<T>& saved, const T* dout,
                         T* da);

}  // namespace trex::dsv4
