#include "model/dsv4/program.h"

#include "core/error.h"
#include "model/dsv4/loss.h"

namespace trex::dsv4 {

// What the backward of a micro-batch needs from its forward, besides what the backend keeps.
struct BlockProgram::SlotState {
  Pass pass;
  SeqLayout layout;
  std::vector<int32_t> ids, targets, mtp_targets, next_ids;
  LossParts loss;
  double loss_scale = 1.0, mtp_weight = 0.0;  // as the forward used them (the backward must match)
  double balance_alpha = 0.0;                 // as the forward used it (a replay recomputes the same gradient)
  bool forward_done = false;
};

namespace {

Stream X(int64_t l) { return Stream{Stream::X, l}; }
Stream Mid(int64_t b) { return Stream{Stream::Mid, b}; }
constexpr Stream kMtpIn{Stream::MtpIn, 0}, kMtpOut{Stream::MtpOut, 0};
constexpr Stream kdA{Stream::dA, 0}, kdB{Stream::dB, 0}, kdMtpIn{Stream::dMtpIn, 0}, kdMtpOut{Stream::dMtpOut, 0};
constexpr Stream kdMid{Stream::dMid, 0};

}  // namespace

BlockProgram::BlockProgram(Backend& backend, ProgramShape shape) : be_(backend), shape_(std::move(shape)) {
  const int64_t n_blocks = shape_.n_layers + (shape_.mtp ? 1 : 0);
  TREX_CHECK(int64_t(shape_.balance.size()) == n_blocks, "block program: balance flags for {} blocks, {} blocks",
             shape_.balance.size(), n_blocks);
  TREX_CHECK(!shape_.mtp || shape_.head, "block program: the MTP block runs on the head stage only");
  slots_.push_back(std::make_unique<SlotState>());
}

BlockProgram::~BlockProgram() = default;

void BlockProgram::set_slots(int64_t n) {
  TREX_CHECK(n >= 1, "block program: {} activation slots", n);
  while (int64_t(slots_.size()) < n) slots_.push_back(std::make_unique<SlotState>());
  slots_.resize(size_t(n));
}

BlockProgram::SlotState& BlockProgram::slot(int64_t i) {
  TREX_CHECK(i >= 0 && i < int64_t(slots_.size()), "block program: no activation slot {} ({} slots)", i,
             slots_.size());
  return *slots_[size_t(i)];
}
const BlockProgram::SlotState& BlockProgram::slot(int64_t i) const {
  return const_cast<BlockProgram*>(this)->slot(i);
}

const LossParts& BlockProgram::losses(int64_t i) const { return slot(i).loss; }

void BlockProgram::block_fwd(const Pass& p, int64_t blk, Stream in, Stream out, double alpha, double grad_scale) {
  be_.site_norm_fwd(p, blk, Site::Attn, in);
  if (p.cached)
    be_.attention_cached(p, blk);
  else
    be_.attention_fwd(p, blk);
  be_.expand_fwd(p, blk, Site::Attn, in, Mid(blk));
  be_.site_norm_fwd(p, blk, Site::Ffn, Mid(blk));
  be_.moe_fwd(p, blk);
  if (alpha != 0.0 && shape_.balance[size_t(blk)]) be_.balance_fwd(p, blk, alpha, grad_scale);
  if (!p.replay) be_.expand_fwd(p, blk, Site::Ffn, Mid(blk), out);  // a replay's backward never reads out
  if (shape_.replays(blk) && !p.replay && p.keeps_activations()) be_.release_block(p, blk);
}

void BlockProgram::block_bwd(const Pass& p, int64_t blk, Stream in, Stream d_out, Stream d_in, double alpha,
                             double grad_scale) {
  if (shape_.replays(blk)) {  // the block's forward again, on its kept input stream and its saved selections
    Pass rp = p;
    rp.replay = true;
    block_fwd(rp, blk, in, Stream{Stream::X, -1}, alpha, grad_scale);
  }
  be_.expand_bwd(p, blk, Site::Ffn, Mid(blk), d_out, kdMid);
  be_.moe_bwd(p, blk);
  be_.site_norm_bwd(p, blk, Site::Ffn, Mid(blk), kdMid);
  be_.expand_bwd(p, blk, Site::Attn, in, kdMid, d_in);
  be_.attention_bwd(p, blk);
  be_.site_norm_bwd(p, blk, Site::Attn, in, d_in);
  if (shape_.replays(blk)) be_.release_block(p, blk);
}

const LossParts& BlockProgram::forward(const MicroBatch& mb) {
  SlotState& s = slot(mb.slot);
  const SeqLayout& layout = *mb.layout;
  const int64_t B = layout.B, S = layout.T, N = B * S, L = shape_.n_layers;
  TREX_CHECK(shape_.embed || mb.x_in, "block program: a stage without the embedding needs the incoming stream");
  TREX_CHECK(shape_.head || mb.x_out, "block program: a stage without the head needs a buffer for its output");
  TREX_CHECK(!shape_.head || mb.labels, "block program: the head stage's forward needs labels");
  s.forward_done = false;
  s.layout = layout;
  s.ids.assign(mb.ids, mb.ids + N);
  s.loss_scale = mb.loss_scale;
  s.mtp_weight = mb.mtp_weight;
  s.balance_alpha = mb.balance_alpha;
  s.pass = Pass{mb.slot, N, s.ids.data(), &s.layout, nullptr, mb.loss_scale, mb.mtp_weight};
  const Pass& p = s.pass;
  be_.begin_pass(p);

  if (shape_.embed)
    be_.embed_fwd(p, X(0));
  else
    be_.stream_in(p, X(0), mb.x_in);
  for (int64_t l = 0; l < L; ++l) block_fwd(p, l, X(l), X(l + 1), mb.balance_alpha, mb.loss_scale);
  if (shape_.head) {
    const int64_t* doc = s.layout.doc_start.data();
    s.targets = shifted_targets(mb.labels, doc, B, S, 1, shape_.vocab);
    be_.head_loss_fwd(p, HeadKind::Main, X(L), s.targets.data());
    if (shape_.mtp) {  // the MTP block predicts token t+2 from the main streams and the embedding of token t+1
      s.next_ids.assign(size_t(N), -1);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t + 1 < S; ++t)
          if (doc[b * S + t + 1] == doc[b * S + t]) s.next_ids[size_t(b * S + t)] = s.ids[size_t(b * S + t + 1)];
      s.mtp_targets = shifted_targets(mb.labels, doc, B, S, 2, shape_.vocab);
      be_.mtp_input_fwd(p, s.next_ids.data(), X(L), kMtpIn);
      block_fwd(p, L, kMtpIn, kMtpOut, mb.balance_alpha, mb.loss_scale);
      be_.head_loss_fwd(p, HeadKind::Mtp, kMtpOut, s.mtp_targets.data());
    }
  } else {
    be_.stream_out(p, X(L), mb.x_out);
  }
  s.loss = be_.losses(p);
  s.loss.total = s.loss.lm;
  if (shape_.mtp) s.loss.total += s.mtp_weight * s.loss.mtp;
  s.loss.total += s.loss.balance;
  s.forward_done = true;
  return s.loss;
}

void BlockProgram::backward(int64_t si, const void* dx_out, void* dx_in, const BlocksReady& ready) {
  SlotState& s = slot(si);
  TREX_CHECK(s.forward_done, "block program: backward of activation slot {} called without a forward", si);
  TREX_CHECK(shape_.head || dx_out, "block program: a stage without the head needs its output's gradient");
  TREX_CHECK(shape_.embed || dx_in, "block program: a stage without the embedding needs a buffer for its input's "
                                    "gradient");
  const Pass& p = s.pass;
  const int64_t L = shape_.n_layers;
  Stream d = kdA, d_prev = kdB;
  if (shape_.head) {
    bool accumulate = false;
    if (shape_.mtp) {
      be_.head_loss_bwd(p, HeadKind::Mtp, kMtpOut, s.mtp_targets.data(), s.mtp_weight * s.loss_scale, kdMtpOut,
                        false);
      block_bwd(p, L, kMtpIn, kdMtpOut, kdMtpIn, s.balance_alpha, s.loss_scale);
      if (ready) ready(L);
      be_.mtp_input_bwd(p, s.next_ids.data(), X(L), kdMtpIn, d, false);
      accumulate = true;
    }
    be_.head_loss_bwd(p, HeadKind::Main, X(L), s.targets.data(), s.loss_scale, d, accumulate);
    if (ready) ready(kHeadReady);
  } else {
    be_.stream_in(p, d, dx_out);
  }
  for (int64_t l = L - 1; l >= 0; --l) {
    block_bwd(p, l, X(l), d, d_prev, s.balance_alpha, s.loss_scale);
    std::swap(d, d_prev);
    if (ready) ready(l);
  }
  if (shape_.embed)
    be_.embed_bwd(p, d);
  else
    be_.stream_out(p, d, dx_in);
  if (ready) ready(-1);
}

void BlockProgram::decode(const int32_t* ids, const CachedTokens& tokens, int64_t n_tok, const int64_t* rows,
                          int64_t n_rows, float* logits) {
  TREX_CHECK(shape_.embed && shape_.head, "block program: decoding needs the whole model (embedding to head)");
  decode_pass(ids, nullptr, tokens, n_tok, rows, n_rows, logits);
}

void BlockProgram::decode_from(const void* x_in, const CachedTokens& tokens, int64_t n_tok, const int64_t* rows,
                               int64_t n_rows, float* logits) {
  TREX_CHECK(!shape_.embed && shape_.head && x_in,
             "block program: decoding from an incoming stream needs a program without the embedding, with the head");
  decode_pass(nullptr, x_in, tokens, n_tok, rows, n_rows, logits);
}

void BlockProgram::decode_pass(const int32_t* ids, const void* x_in, const CachedTokens& tokens, int64_t n_tok,
                               const int64_t* rows, int64_t n_rows, float* logits) {
  const Pass p{0, n_tok, ids, nullptr, &tokens};
  be_.begin_pass(p);
  if (x_in)
    be_.stream_in(p, X(0), x_in);
  else
    be_.embed_fwd(p, X(0));
  for (int64_t l = 0; l < shape_.n_layers; ++l) block_fwd(p, l, X(l), X(l + 1), 0.0, 1.0);
  be_.head_logits(p, X(shape_.n_layers), rows, n_rows, logits);
}

}  // namespace trex::dsv4
