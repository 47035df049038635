// Token embedding and stream expansion (design §2.1): every one of the n_hc streams starts as Embed[token].
#pragma once
#include <cstdint>

namespace trex::dsv4 {

// X[N, n_hc, d] (written). Token ids are checked against the vocabulary.
template <class T>
void embed_streams_fwd(const int32_t* ids, int64_t n_tok, const T* table, int64_t vocab, int64_t d, int64_t n_hc,
                       T* X);
// dtable[token] += sum over streams of dX[t, i] (serial over tokens: deterministic).
template <class T>
void embed_streams_bwd(const int32_t* ids, int64_t n_tok, int64_t d, int64_t n_hc, const T* dX, T* dtable);

// Plain lookup (the MTP's embedding of token t+1): out[N, d]; ids < 0 give a zero row.
template <class T>
void embed_rows_fwd(const int32_t* ids, int64_t n_tok, const T* table, int64_t vocab, int64_t d, T* out);
template <class T>
void embed_rows_bwd(const int32_t* ids, int64_t n_tok, int64_t d, const T* dout, T* dtable);

}  // namespace trex::dsv4
