#include "model/dsv4/embedding.h"

#include <algorithm>

#include "core/error.h"

namespace trex::dsv4 {

template <class T>
void embed_streams_fwd(const int32_t* ids, int64_t n_tok, const T* table, int64_t vocab, int64_t d, int64_t n_hc,
                       T* X) {
  for (int64_t t = 0; t < n_tok; ++t) {
    TREX_CHECK(ids[t] >= 0 && ids[t] < vocab, "token id {} at position {} outside the vocabulary [0, {})", ids[t],
               t, vocab);
    for (int64_t i = 0; i < n_hc; ++i) std::copy_n(table + int64_t(ids[t]) * d, d, X + (t * n_hc + i) * d);
  }
}

template <class T>
void embed_streams_bwd(const int32_t* ids, int64_t n_tok, int64_t d, int64_t n_hc, const T* dX, T* dtable) {
  for (int64_t t = 0; t < n_tok; ++t) {
    T* row = dtable + int64_t(ids[t]) * d;
    for (int64_t i = 0; i < n_hc; ++i)
      for (int64_t e = 0; e < d; ++e) row[e] += dX[(t * n_hc + i) * d + e];
  }
}

template <class T>
void embed_rows_fwd(const int32_t* ids, int64_t n_tok, const T* table, int64_t vocab, int64_t d, T* out) {
  for (int64_t t = 0; t < n_tok; ++t) {
    if (ids[t] < 0) {
      std::fill_n(out + t * d, d, T(0));
      continue;
    }
    TREX_CHECK(ids[t] < vocab, "token id {} at position {} outside the vocabulary [0, {})", ids[t], t, vocab);
    std::copy_n(table + int64_t(ids[t]) * d, d, out + t * d);
  }
}

template <class T>
void embed_rows_bwd(const int32_t* ids, int64_t n_tok, int64_t d, const T* dout, T* dtable) {
  for (int64_t t = 0; t < n_tok; ++t) {
    if (ids[t] < 0) continue;
    T* row = dtable + int64_t(ids[t]) * d;
    for (int64_t e = 0; e < d; ++e) row[e] += dout[t * d + e];
  }
}

#define TREX_EMB_INSTANTIATE(T)                                                                         \
  template void embed_streams_fwd<T>(const int32_t*, int64_t, const T*, int64_t, int64_t, int64_t, T*); \
  template void embed_streams_bwd<T>(const int32_t*, int64_t, int64_t, int64_t, const T*, T*);          \
  template void embed_rows_fwd<T>(const int32_t*, int64_t, const T*, int64_t, int64_t, T*);             \
  template void embed_rows_bwd<T>(const int32_t*, int64_t, int64_t, const T*, T*);
TREX_EMB_INSTANTIATE(float)
TREX_EMB_INSTANTIATE(double)

}  // namespace trex::dsv4
