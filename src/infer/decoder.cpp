#include "infer/decoder.h"

#include <set>

#include "core/error.h"

namespace trex::infer {

using namespace trex::dsv4;

SequenceCache::~SequenceCache() = default;

std::vector<LayerCacheCounts> SequenceCache::counts() const {
  std::vector<LayerCacheCounts> out;
  for (const auto& l : caches_.layers) out.push_back(l.counts());
  return out;
}

std::unique_ptr<SequenceCache> SequenceCache::clone() const {
  std::unique_ptr<SequenceCache> s(new SequenceCache());
  s->length_ = length_;
  s->caches_.layers = caches_.layers;  // plain values: a deep copy
  return s;
}

int64_t SequenceCache::floats() const {
  int64_t n = 0;
  for (const auto& k : counts()) n += k.floats;
  return n;
}

Decoder::Decoder(Model<float>& model, int64_t max_context)
    : cfg_(model.config()), max_context_(max_context > 0 ? max_context : cfg_.max_position) {
  TREX_CHECK(max_context_ > 0, "decoder: no context limit (config max_position_embeddings is {}); pass one",
             cfg_.max_position);
  TREX_CHECK(model.params().allocated(), "decoder: the model's parameters are not allocated");
  const ModelPartition& part = model.partition();
  TREX_CHECK(part.embed && part.head && part.layer_begin == 0 && part.layer_end == cfg_.n_layers &&
                 part.expert_begin == 0 && part.expert_end == cfg_.n_routed_experts,
             "decoder: the model holds layers [{}, {}) and experts [{}, {}); decoding needs the whole model",
             part.layer_begin, part.layer_end, part.expert_begin, part.expert_end);
  const bool mtp = model.has_mtp();
  backend_ = std::make_unique<CpuBackend<float>>(
      cfg_, model.params(), model.cpu_blocks(),
      CpuBackendShape{true, true, mtp, cfg_.n_layers, 0, cfg_.n_routed_experts});
  ProgramShape ps;
  ps.n_layers = cfg_.n_layers, ps.mtp = mtp, ps.vocab = cfg_.vocab_size;
  ps.balance.assign(size_t(model.n_blocks()), 0);  // no losses in decoding
  program_ = std::make_unique<BlockProgram>(*backend_, std::move(ps));
}

Decoder::~Decoder() = default;

std::unique_ptr<SequenceCache> Decoder::new_sequence() const {
  std::unique_ptr<SequenceCache> s(new SequenceCache());
  std::unique_ptr<SequenceCaches> c = backend_->new_caches();
  s->caches_.layers = std::move(static_cast<CpuSequenceCaches&>(*c).layers);
  return s;
}

void Decoder::step(const std::vector<StepItem>& items, std::vector<float>& logits) {
  const int64_t V = cfg_.vocab_size;
  // Validate everything before any cache changes.
  std::vector<int32_t> ids;
  std::vector<int64_t> pos, seq, seq_begin{0};
  std::vector<SequenceCaches*> caches;
  std::set<const SequenceCache*> seen;
  for (size_t it = 0; it < items.size(); ++it) {
    const StepItem& x = items[it];
    TREX_CHECK(x.seq != nullptr, "decoder step: item {} has no sequence", it);
    TREX_CHECK(x.n >= 1 && x.ids != nullptr, "decoder step: item {} has no tokens", it);
    TREX_CHECK(seen.insert(x.seq).second, "decoder step: a sequence appears twice in one step (item {})", it);
    TREX_CHECK(int64_t(x.seq->caches_.layers.size()) == cfg_.n_layers,
               "decoder step: item {} belongs to another model", it);
    TREX_CHECK(x.seq->length_ + x.n <= max_context_,
               "decoder step: sequence of {} tokens + {} new would exceed the context limit of {} tokens",
               x.seq->length_, x.n, max_context_);
    for (int64_t j = 0; j < x.n; ++j) {
      TREX_CHECK(x.ids[j] >= 0 && x.ids[j] < V,
                 "decoder step: token id {} (item {}, token {}) outside [0, {})", x.ids[j], it, j, V);
      ids.push_back(x.ids[j]);
      pos.push_back(x.seq->length_ + j);
      seq.push_back(int64_t(it));
    }
    seq_begin.push_back(int64_t(ids.size()));
    caches.push_back(&x.seq->caches_);
  }
  logits.clear();
  const int64_t N = int64_t(ids.size());
  if (N == 0) return;

  // The head runs on the rows whose logits were asked for.
  std::vector<int64_t> rows;
  for (size_t it = 0; it < items.size(); ++it) {
    const int64_t b = seq_begin[it], e = seq_begin[it + 1];
    for (int64_t i = items[it].all_logits ? b : e - 1; i < e; ++i) rows.push_back(i);
  }
  const CachedTokens tokens{pos.data(), seq.data(), seq_begin.data(), int64_t(items.size()), caches.data()};
  logits.assign(rows.size() * size_t(V), 0.f);
  program_->decode(ids.data(), tokens, N, rows.data(), int64_t(rows.size()), logits.data());
  for (const StepItem& x : items) x.seq->length_ += x.n;
}

void Decoder::step(SequenceCache& seq, const std::vector<int32_t>& ids, std::vector<float>& logits,
                   bool all_logits) {
  step({StepItem{&seq, ids.data(), int64_t(ids.size()), all_logits}}, logits);
}

}  // namespace trex::infer
