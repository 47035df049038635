#include "model/dsv4/loss.h"

#include "core/error.h"
#include "kernels/cpu/cross_entropy.h"

namespace trex::dsv4 {

std::vector<int32_t> shifted_targets(const int32_t* labels, const int64_t* doc_start, int64_t B, int64_t S,
                                     int64_t shift, int64_t vocab) {
  std::vector<int32_t> out(size_t(B * S), -1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s + shift < S; ++s) {
      const int64_t t = b * S + s, u = t + shift;
      const int32_t lab = labels[u];
      if (lab < 0) continue;
      TREX_CHECK(lab < vocab, "label {} at row {} position {} outside the vocabulary [0, {})", lab, b, s + shift,
                 vocab);
      if (doc_start && doc_start[u] != doc_start[t]) continue;
      out[size_t(t)] = lab;
    }
  return out;
}

template <class T>
double lm_loss_fwd(const T* logits, const int32_t* targets, int64_t n, int64_t vocab, T* lse, int64_t* count) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; ++i) c += targets[i] >= 0;
  *count = c;
  const double sum = cpu::cross_entropy_fwd(lse, logits, targets, n, vocab);
  return c > 0 ? sum / double(c) : 0.0;
}

template <class T>
void lm_loss_bwd(const T* logits, const T* lse, const int32_t* targets, int64_t n, int64_t vocab, int64_t count,
                 double weight, T* dlogits) {
  cpu::cross_entropy_bwd(dlogits, logits, lse, targets, n, vocab, count > 0 ? weight / double(count) : 0.0);
}

template double lm_loss_fwd<float>(const float*, const int32_t*, int64_t, int64_t, float*, int64_t*);
template double lm_loss_fwd<double>(const double*, const int32_t*, int64_t, int64_t, double*, int64_t*);
template void lm_loss_bwd<float>(const float*, const float*, const int32_t*, int64_t, int64_t, int64_t, double,
                                 float*);
template void lm_loss_bwd<double>(const double*, const double*, const int32_t*, int64_t, int64_t, int64_t, double,
                                  double*);

}  // namespace trex::dsv4
