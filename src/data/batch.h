// One training batch in the layout the model consumes: [batch, seq] token ids, next-token labels (-1 where
// nothing is predicted: document ends, prompt tokens, padding), per-token positions that restart at every
// document start, and the document-start flags (attention, compressors and the indexer must not look
// across them; design §2.11).
#pragma once
#include <cstdint>
#include <vector>

namespace trex::data {

struct Batch {
  int64_t batch = 0, seq = 0;
  std::vector<int32_t> input_ids;  // [batch * seq]
  std::vector<int32_t> labels;     // [batch * seq], -1 = ignore
  std::vector<int32_t> pos;        // [batch * seq], 0 at each document start
  std::vector<uint8_t> doc_start;  // [batch * seq], 1 where a document (or a split chunk, or padding) starts
  int64_t n_targets = 0;           // labels != -1
};

}  // namespace trex::data
