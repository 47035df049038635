// The incremental decoder against the golden fixtures and the model's uncached forward:
//  - greedy decoding reproduces the reference's generate.output_ids (tiny, v4-tiny-b, v4-tiny-c);
//  - cached logits at every position equal Model::forward on the whole sequence (and the fixture logits),
//    whatever the chunking of the prompt and with several sequences batched in one step;
//  - the caches hold window + S/m entries per layer, not S.
#include <gtest/gtest.h>

#include <random>

#include "infer/decoder.h"
#include "infer/generate.h"
#include "infer_test_util.h"

using namespace trex;
using namespace trex::infer;

namespace {

struct Fixture {
  std::unique_ptr<dsv4::Model<float>> model;
  std::unique_ptr<ckpt::SafetensorsReader> io;
};

Fixture load_fixture(const std::string& name) {
  Fixture f;
  const auto dir = test::dsv4_fixture(name);
  f.model = load_inference_model(dir);
  f.io = std::make_unique<ckpt::SafetensorsReader>(dir / "io.safetensors");
  return f;
}

class DecoderFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderFixture, GreedyDecodingReproducesReferenceOutputIds) {
  Fixture f = load_fixture(GetParam());
  Decoder dec(*f.model);
  const auto prompts = test::int_rows(*f.io, "generate.prompt_ids");
  const auto expected = test::int_rows(*f.io, "generate.output_ids");
  GenerateOptions go;
  go.max_new_tokens = int64_t(expected[0].size());
  go.min_new_tokens = go.max_new_tokens;  // the reference ran with min_new_tokens = max_new_tokens
  const auto out = generate(dec, prompts, go);
  ASSERT_EQ(out.size(), expected.size());
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].tokens, expected[i]) << GetParam() << " row " << i;
    EXPECT_EQ(out[i].finish_reason, "length");
  }
  // Chunked prefill (chunks smaller than the window and the compression rates) gives the same tokens.
  go.prefill_chunk = 7;
  const auto chunked = generate(dec, prompts, go);
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_EQ(chunked[i].tokens, expected[i]) << GetParam() << " row " << i;
}

TEST_P(DecoderFixture, CachedLogitsEqualUncachedForwardAtEveryPosition) {
  Fixture f = load_fixture(GetParam());
  const auto ids = test::int_rows(*f.io, "input_ids");
  const int64_t B = int64_t(ids.size()), S = int64_t(ids[0].size()), V = f.model->config().vocab_size;
  // Uncached reference: the model's full forward over the whole batch.
  std::vector<int32_t> flat, labels(size_t(B * S), -100);
  for (const auto& r : ids) flat.insert(flat.end(), r.begin(), r.end());
  f.model->forward(flat.data(), labels.data(), dsv4::SeqLayout::unpacked(B, S));
  const std::vector<float> full(f.model->logits(), f.model->logits() + B * S * V);
  const float* ref = f.io->view("logits").as<const float>();
  EXPECT_LT(test::rel_max_err(full.data(), ref, B * S * V), 1e-4) << "model forward vs fixture";

  // Cached: every row batched in the same steps, each with its own chunking (row r: a prompt of 13 + 5r
  // tokens, then single tokens for a while, then chunks of 3 + r).
  Decoder dec(*f.model);
  std::vector<std::unique_ptr<SequenceCache>> seqs;
  for (int64_t b = 0; b < B; ++b) seqs.push_back(dec.new_sequence());
  std::vector<float> cached(size_t(B * S * V)), logits;
  std::vector<int64_t> fed(size_t(B), 0);
  for (int64_t step = 0;; ++step) {
    std::vector<StepItem> items;
    std::vector<int64_t> who;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t left = S - fed[size_t(b)];
      if (left == 0) continue;
      const int64_t want = step == 0 ? 13 + 5 * b : (step < 40 ? 1 : 3 + b);
      items.push_back(
          {seqs[size_t(b)].get(), ids[size_t(b)].data() + fed[size_t(b)], std::min(want, left), true});
      who.push_back(b);
    }
    if (items.empty()) break;
    dec.step(items, logits);
    int64_t row = 0;
    for (size_t k = 0; k < items.size(); ++k) {
      const int64_t b = who[k];
      std::copy_n(logits.data() + row * V, items[k].n * V, cached.data() + (b * S + fed[size_t(b)]) * V);
      row += items[k].n;
      fed[size_t(b)] += items[k].n;
    }
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      const int64_t o = (b * S + t) * V;
      ASSERT_LT(test::rel_max_err(cached.data() + o, full.data() + o, V), 1e-4)
          << GetParam() << " row " << b << " position " << t;
    }
  EXPECT_LT(test::rel_max_err(cached.data(), ref, B * S * V), 1e-4) << "decoder vs fixture";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecoderFixture, ::testing::Values("tiny", "v4-tiny-b", "v4-tiny-c"),
                         test::fixture_param_name);

TEST(DecoderCache, GrowsByCompressedEntriesNotTokens) {
  Fixture f = load_fixture("tiny");
  const dsv4::ModelConfig& cfg = f.model->config();
  Decoder dec(*f.model);
  auto seq = dec.new_sequence();
  std::mt19937 rng(7);
  std::vector<float> logits;
  int64_t floats_prev = 0, len_prev = 0;
  for (int64_t target : {1, 3, 16, 17, 100, 333, 700}) {
    std::vector<int32_t> ids;
    while (seq->length() + int64_t(ids.size()) < target) ids.push_back(int32_t(rng() % 300) + 10);
    dec.step(*seq, ids, logits);
    const int64_t S = seq->length();
    ASSERT_EQ(S, target);
    const auto counts = seq->counts();
    ASSERT_EQ(int64_t(counts.size()), cfg.n_layers);
    int64_t expect_growth = 0;
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      const auto& k = counts[size_t(l)];
      const int64_t m = cfg.compress_ratio[size_t(l)], W = cfg.window, c = cfg.head_dim,
                    cI = cfg.index_head_dim;
      EXPECT_EQ(k.window_rows, std::min(S, W)) << "layer " << l;
      if (m == 0) {
        EXPECT_EQ(k.compressed, 0);
        EXPECT_EQ(k.floats, W * c) << "a sliding layer's cache is the window ring only";
        continue;
      }
      EXPECT_EQ(k.compressed, S / m) << "layer " << l << " S " << S;
      EXPECT_EQ(k.partial_rows, S % m) << "layer " << l;
      const bool csa = cfg.attn_types[size_t(l)] == dsv4::AttnType::CSA;
      EXPECT_EQ(k.prev_rows, csa && S >= m ? m : 0) << "layer " << l;
      EXPECT_EQ(k.index_keys, csa ? S / m : 0) << "layer " << l;
      // Constant part: ring + partial window (+ previous "b" window, + the indexer's), then c per entry.
      const int64_t fixed =
          csa ? W * c + (4 * m * c + 2 * m * c) + (4 * m * cI + 2 * m * cI) : W * c + 2 * m * c;
      EXPECT_EQ(k.floats, fixed + (S / m) * c + (csa ? (S / m) * cI : 0)) << "layer " << l;
      expect_growth += (S / m - len_prev / m) * (c + (csa ? cI : 0));
    }
    if (len_prev > 0) {
      EXPECT_EQ(seq->floats() - floats_prev, expect_growth);
    }
    // Never O(S): the whole cache is below what one raw K=V row per token per layer would need.
    if (S >= 333) {
      EXPECT_LT(seq->floats(), S * cfg.head_dim * cfg.n_layers);
    }
    floats_prev = seq->floats(), len_prev = S;
  }
}

TEST(DecoderCache, RejectsContextOverflowAndBadIdsWithoutTouchingTheCache) {
  Fixture f = load_fixture("tiny");
  Decoder dec(*f.model, /*max_context=*/40);
  auto seq = dec.new_sequence();
  std::vector<float> logits;
  dec.step(*seq, std::vector<int32_t>(30, 5), logits);
  EXPECT_THROW(dec.step(*seq, std::vector<int32_t>(11, 5), logits), trex::Error);
  EXPECT_THROW(dec.step(*seq, {5, 320}, logits), trex::Error);
  EXPECT_THROW(dec.step(*seq, {-1}, logits), trex::Error);
  EXPECT_EQ(seq->length(), 30);
  dec.step(*seq, std::vector<int32_t>(10, 5), logits);
  EXPECT_EQ(seq->length(), 40);
}

}  // namespace
