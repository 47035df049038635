// The CPU engine: Decoder + one SequenceCache per slot.
#include "core/error.h"
#include "infer/decoder.h"
#include "infer/engine.h"

namespace trex::infer {
namespace {

class CpuEngine final : public Engine {
 public:
  CpuEngine(std::shared_ptr<dsv4::Model<float>> model, int64_t slots, int64_t max_context)
      : model_(std::move(model)), decoder_(*model_, max_context) {
    TREX_CHECK(slots >= 1, "cpu engine: need at least one slot, got {}", slots);
    for (int64_t i = 0; i < slots; ++i) seqs_.push_back(decoder_.new_sequence());
  }
  std::string name() const override { return "cpu"; }
  const dsv4::ModelConfig& config() const override { return decoder_.config(); }
  int64_t slots() const override { return int64_t(seqs_.size()); }
  int64_t max_context() const override { return decoder_.max_context(); }
  int64_t slot_length(int64_t slot) const override { return seqs_.at(size_t(slot))->length(); }
  void reset(int64_t slot) override {
    TREX_CHECK(slot >= 0 && slot < slots(), "cpu engine: slot {} out of range [0, {})", slot, slots());
    seqs_[size_t(slot)] = decoder_.new_sequence();
  }
  void forward(const std::vector<EngineFeed>& feeds, std::vector<float>& logits) override {
    std::vector<StepItem> items;
    for (const EngineFeed& f : feeds) {
      TREX_CHECK(f.slot >= 0 && f.slot < slots(), "cpu engine: slot {} out of range [0, {})", f.slot,
                 slots());
      items.push_back(StepItem{seqs_[size_t(f.slot)].get(), f.ids, f.n, false});
    }
    decoder_.step(items, logits);
  }
  void copy_slot(int64_t from, int64_t to) override {
    TREX_CHECK(from >= 0 && from < slots() && to >= 0 && to < slots() && from != to,
               "cpu engine: cannot copy slot {} to slot {} (slots [0, {}))", from, to, slots());
    seqs_[size_t(to)] = seqs_[size_t(from)]->clone();
  }
  int64_t cache_bytes() const override {
    int64_t b = 0;
    for (const auto& s : seqs_) b += int64_t(s->bytes());
    return b;
  }

 private:
  std::shared_ptr<dsv4::Model<float>> model_;
  Decoder decoder_;
  std::vector<std::unique_ptr<SequenceCache>> seqs_;
};

}  // namespace

std::unique_ptr<Engine> make_cpu_engine(std::shared_ptr<dsv4::Model<float>> model, int64_t slots,
                                        int64_t max_context) {
  TREX_CHECK(model != nullptr, "cpu engine: no model");
  return std::make_unique<CpuEngine>(std::move(model), slots, max_context);
}

}  // namespace trex::infer
