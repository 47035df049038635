#include "model/dsv4/seq_layout.h"

#include <algorithm>

#include "core/error.h"

namespace trex::dsv4 {

int64_t SeqLayout::max_pos() const {
  int64_t m = -1;
  for (int64_t p : pos) m = std::max(m, p);
  return m;
}

SeqLayout SeqLayout::unpacked(int64_t B, int64_t T) {
  SeqLayout l;
  l.B = B;
  l.T = T;
  l.pos.resize(size_t(B * T));
  l.doc_start.assign(size_t(B * T), 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) l.pos[size_t(b * T + t)] = t;
  return l;
}

SeqLayout SeqLayout::packed(int64_t T, const std::vector<std::vector<int64_t>>& doc_lengths) {
  SeqLayout l;
  l.B = int64_t(doc_lengths.size());
  l.T = T;
  l.pos.resize(size_t(l.B * T));
  l.doc_start.resize(size_t(l.B * T));
  for (int64_t b = 0; b < l.B; ++b) {
    int64_t t = 0;
    for (int64_t len : doc_lengths[size_t(b)]) {
      TREX_CHECK(len > 0, "SeqLayout::packed: row {} has a document of length {} (must be > 0)", b, len);
      TREX_CHECK(t + len <= T, "SeqLayout::packed: row {} documents exceed the row length {}", b, T);
      for (int64_t i = 0; i < len; ++i) {
        l.pos[size_t(b * T + t + i)] = i;
        l.doc_start[size_t(b * T + t + i)] = t;
      }
      t += len;
    }
    TREX_CHECK(t == T, "SeqLayout::packed: row {} documents cover {} tokens, expected {}", b, t, T);
  }
  return l;
}

void SeqLayout::validate() const {
  TREX_CHECK(B >= 0 && T >= 0, "SeqLayout: negative size B={} T={}", B, T);
  TREX_CHECK(int64_t(pos.size()) == B * T && int64_t(doc_start.size()) == B * T,
             "SeqLayout: pos has {} and doc_start {} entries, expected B*T = {}", pos.size(),
             doc_start.size(), B * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = b * T + t, s = doc_start[size_t(i)];
      TREX_CHECK(pos[size_t(i)] >= 0, "SeqLayout: negative position {} at row {} token {}", pos[size_t(i)], b,
                 t);
      const bool starts = s == t, continues = t > 0 && s == doc_start[size_t(i - 1)] && s < t;
      TREX_CHECK(
          starts || continues,
          "SeqLayout: doc_start {} at row {} token {} neither starts a document nor continues the previous "
          "token's document",
          s, b, t);
    }
}

}  // namespace trex::dsv4
