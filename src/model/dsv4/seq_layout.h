// Token layout of one batch for the attention sub-layer: B rows of T tokens, each row holding one or
// more packed documents (design §2.11). Per token: its position inside its document (RoPE uses it)
// and the row-local index of its document's first token (windows, compression and visibility are
// all confined to the document).
#pragma once
#include <cstdint>
#include <vector>

namespace trex::dsv4 {

struct SeqLayout {
  int64_t B = 0, T = 0;
  std::vector<int64_t> pos;        // [B*T] position inside the document (0 at the document start)
  std::vector<int64_t> doc_start;  // [B*T] row-local index of the token's document's first token

  int64_t n_tokens() const { return B * T; }
  int64_t max_pos() const;  // largest pos (-1 when empty)

  // One document per row, pos = t.
  static SeqLayout unpacked(int64_t B, int64_t T);
  // doc_lengths[b] lists row b's documents in order; each row's lengths must sum to T. pos restarts at 0.
  static SeqLayout packed(int64_t T, const std::vector<std::vector<int64_t>>& doc_lengths);
  // Throws trex::Error unless sizes match, doc_start is consistent (each token starts a document or
  // continues its predecessor's) and positions are non-negative.
  void validate() const;
};

}  // namespace trex::dsv4
