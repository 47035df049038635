// One training batch in the layout the model consumes: [batch, seq] token ids, labels, per-token positions that
// restart at every document start, and the document-start flags (attention, compressors and the indexer must not
// look across them; design §2.11).
//
// Labels follow the model's convention (transformers', the golden fixtures'): aligned with the ids, labels[t] is
// the token at t when it is a training target, -1 when it is not (prompt tokens, padding, and always a document's
// first token, which nothing before it in the document predicts). The model does the one shift itself
// (dsv4::shifted_targets): position t is trained to predict labels[t + 1], the MTP block labels[t + 2], both
// within t's document.
#pragma once
#include <cstdint>
#include <vector>

namespace trex::data {

struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> input_ids;  // [batch * seq]
  std::vector<int32_t> labels;     // [batch * seq], the token at t if it is a target, else -1 (see above)
  std::vector<int32_t> pos;        // [batch * seq], 0 at each document start
  std::vector<uint8_t> doc_start;  // [batch * seq], 1 where a document (or a split chunk, or padding) starts
  int64_t n_targets = 0;           // labels != -1: the next-token predictions the batch trains
};

}  // namespace trex::data
