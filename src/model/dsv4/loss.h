// Masked next-token cross-entropy (fixture README conventions): position t of a row predicts labels[t + shift]
// (shift 1 for the main head, 2 for the MTP head); -100 (any negative label) = no loss; a target in another
// packed document than t is not predicted. The loss is ONE mean over all counted targets of the batch.
#pragma once
#include <cstdint>
#include <vector>

namespace trex::dsv4 {

// targets[B*S]: the label each position predicts, or -1. doc_start (nullable, [B*S], row-local index of each
// token's document start) confines targets to the token's own document.
std::vector<int32_t> shifted_targets(const int32_t* labels, const int64_t* doc_start, int64_t B, int64_t S,
                                     int64_t shift, int64_t vocab);

// Returns the mean CE over counted targets (0 when none) and writes lse[N]; count receives the number counted.
template <class T>
double lm_loss_fwd(const T* logits, const int32_t* targets, int64_t n, int64_t vocab, T* lse, int64_t* count);
// dlogits[N, V] (written) = weight * d(mean CE)/dlogits.
template <class T>
void lm_loss_bwd(const T* logits, const T* lse, const int32_t* targets, int64_t n, int64_t vocab, int64_t count,
                 double weight, T* dlogits);

}  // namespace trex::dsv4
