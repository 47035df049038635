// The block program's contract with a backend: which ops run, in which order, on which streams, for a training
// forward / backward (with the MTP block and pipeline stage boundaries) and for a cached decode step. A recording
// backend logs every call; the expectations are the sequence of design §2.3 / §2.10 written out by hand.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "model/dsv4/program.h"

namespace {

using trex::dsv4::Backend;
using trex::dsv4::HeadKind;
using trex::dsv4::LossParts;
using trex::dsv4::Pass;
using trex::dsv4::SequenceCaches;
using trex::dsv4::Site;
using trex::dsv4::Stream;

std::string name(Stream s) {
  static const char* k[] = {"X", "Mid", "MtpIn", "MtpOut", "dA", "dB", "dMid", "dMtpIn", "dMtpOut"};
  return std::string(k[s.kind]) + (s.kind == Stream::X || s.kind == Stream::Mid ? std::to_string(s.index) : "");
}
const char* site(Site s) { return s == Site::Attn ? "attn" : "ffn"; }

class Recorder final : public Backend {
 public:
  std::vector<std::string> log;
  void add(const std::string& s) { log.push_back(s); }
  void begin_pass(const Pass& p) override { add(p.cached ? "begin decode" : "begin train"); }
  void embed_fwd(const Pass&, Stream o) override { add("embed " + name(o)); }
  void embed_bwd(const Pass&, Stream d) override { add("embed_bwd " + name(d)); }
  void stream_in(const Pass&, Stream s, const void*) override { add("in " + name(s)); }
  void stream_out(const Pass&, Stream s, void*) override { add("out " + name(s)); }
  void site_norm_fwd(const Pass&, int64_t b, Site s, Stream in) override {
    add("site " + std::to_string(b) + site(s) + " " + name(in));
  }
  void site_norm_bwd(const Pass&, int64_t b, Site s, Stream in, Stream d) override {
    add("site_bwd " + std::to_string(b) + site(s) + " " + name(in) + " +" + name(d));
  }
  void expand_fwd(const Pass&, int64_t b, Site s, Stream in, Stream out) override {
    add("expand " + std::to_string(b) + site(s) + " " + name(in) + ">" + name(out));
  }
  void expand_bwd(const Pass&, int64_t b, Site s, Stream in, Stream dout, Stream din) override {
    add("expand_bwd " + std::to_string(b) + site(s) + " " + name(in) + " " + name(dout) + ">" + name(din));
  }
  void attention_fwd(const Pass&, int64_t b) override { add("attn " + std::to_string(b)); }
  void attention_bwd(const Pass&, int64_t b) override { add("attn_bwd " + std::to_string(b)); }
  void attention_cached(const Pass&, int64_t b) override { add("attn_cached " + std::to_string(b)); }
  void moe_fwd(const Pass& p, int64_t b) override { add((p.replay ? "moe replay " : "moe ") + std::to_string(b)); }
  void moe_bwd(const Pass&, int64_t b) override { add("moe_bwd " + std::to_string(b)); }
  void balance_fwd(const Pass&, int64_t b, double, double scale) override {
    add("balance " + std::to_string(b) + " x" + std::to_string(int(scale * 4)));
    loss.balance += 0.5;
  }
  void head_loss_fwd(const Pass&, HeadKind h, Stream in, const int32_t*) override {
    add(std::string(h == HeadKind::Mtp ? "mtp_head " : "head ") + name(in));
    (h == HeadKind::Mtp ? loss.mtp : loss.lm) = h == HeadKind::Mtp ? 2.0 : 3.0;
  }
  void head_loss_bwd(const Pass&, HeadKind h, Stream in, const int32_t*, double w, Stream d, bool acc) override {
    add(std::string(h == HeadKind::Mtp ? "mtp_head_bwd " : "head_bwd ") + name(in) + (acc ? " +" : " =") + name(d) +
        " w" + std::to_string(int(w * 100)));
  }
  void head_logits(const Pass&, Stream in, const int64_t*, int64_t n, float*) override {
    add("logits " + name(in) + " rows " + std::to_string(n));
  }
  void mtp_input_fwd(const Pass&, const int32_t*, Stream m, Stream o) override {
    add("mtp_in " + name(m) + ">" + name(o));
  }
  void mtp_input_bwd(const Pass&, const int32_t*, Stream m, Stream d, Stream dm, bool acc) override {
    add("mtp_in_bwd " + name(m) + " " + name(d) + (acc ? " +" : " =") + name(dm));
  }
  void release_block(const Pass&, int64_t b) override { add("release " + std::to_string(b)); }
  LossParts losses(const Pass&) override { return loss; }
  std::unique_ptr<SequenceCaches> new_caches() const override { return nullptr; }
  LossParts loss;
};

std::vector<std::string> block_fwd(int b, const std::string& in, const std::string& out, bool balance, bool cached) {
  const std::string B = std::to_string(b), mid = "Mid" + B;
  std::vector<std::string> v{"site " + B + "attn " + in, (cached ? "attn_cached " : "attn ") + B,
                             "expand " + B + "attn " + in + ">" + mid, "site " + B + "ffn " + mid, "moe " + B};
  if (balance) v.push_back("balance " + B + " x2");
  v.push_back("expand " + B + "ffn " + mid + ">" + out);
  return v;
}

std::vector<std::string> block_bwd(int b, const std::string& in, const std::string& dout, const std::string& din) {
  const std::string B = std::to_string(b), mid = "Mid" + B;
  return {"expand_bwd " + B + "ffn " + mid + " " + dout + ">dMid", "moe_bwd " + B,
          "site_bwd " + B + "ffn " + mid + " +dMid",              "expand_bwd " + B + "attn " + in + " dMid>" + din,
          "attn_bwd " + B,                                          "site_bwd " + B + "attn " + in + " +" + din};
}

void append(std::vector<std::string>& a, const std::vector<std::string>& b) { a.insert(a.end(), b.begin(), b.end()); }

TEST(BlockProgram, TrainingForwardAndBackwardOfTheWholeModelWithMtp) {
  Recorder be;
  trex::dsv4::ProgramShape shape;
  shape.n_layers = 2, shape.mtp = true, shape.vocab = 10, shape.balance = {1, 0, 1};  // layer 1 hash-routed
  trex::dsv4::BlockProgram prog(be, shape);
  const std::vector<int32_t> ids{1, 2, 3, 4}, labels{1, 2, 3, 4};
  const trex::dsv4::SeqLayout layout = trex::dsv4::SeqLayout::unpacked(1, 4);
  trex::dsv4::MicroBatch mb;
  mb.ids = ids.data(), mb.labels = labels.data(), mb.layout = &layout;
  mb.loss_scale = 0.5, mb.mtp_weight = 0.25, mb.balance_alpha = 1e-4;
  const LossParts& l = prog.forward(mb);
  EXPECT_DOUBLE_EQ(l.total, 3.0 + 0.25 * 2.0 + 1.0);  // lm + w * mtp + balance of the two score-routed blocks

  std::vector<std::string> want{"begin train", "embed X0"};
  append(want, block_fwd(0, "X0", "X1", true, false));
  append(want, block_fwd(1, "X1", "X2", false, false));
  append(want, {"head X2", "mtp_in X2>MtpIn"});
  append(want, block_fwd(2, "MtpIn", "MtpOut", true, false));
  want.push_back("mtp_head MtpOut");
  EXPECT_EQ(be.log, want);

  be.log.clear();
  std::vector<int64_t> ready;
  prog.backward(0, nullptr, nullptr, [&](int64_t b) { ready.push_back(b); });
  want = {"mtp_head_bwd MtpOut =dMtpOut w12"};
  append(want, block_bwd(2, "MtpIn", "dMtpOut", "dMtpIn"));
  append(want, {"mtp_in_bwd X2 dMtpIn =dA", "head_bwd X2 +dA w50"});
  append(want, block_bwd(1, "X1", "dA", "dB"));
  append(want, block_bwd(0, "X0", "dB", "dA"));
  want.push_back("embed_bwd dA");
  EXPECT_EQ(be.log, want);
  EXPECT_EQ(ready, (std::vector<int64_t>{2, trex::dsv4::kHeadReady, 1, 0, -1}));
}

// Full recomputation: each block is released after its forward; in the backward its forward re-runs (replay: the
// saved selections, the balance gradient again at the forward's scale, no last expand) right before its backward,
// which is followed by another release. The losses are the forward's alone (the replay adds nothing).
TEST(BlockProgram, FullRecomputationReplaysEachBlockBeforeItsBackward) {
  Recorder be;
  trex::dsv4::ProgramShape shape;
  shape.n_layers = 2, shape.mtp = true, shape.vocab = 10, shape.balance = {1, 0, 1}, shape.replay = {1, 1, 1};
  trex::dsv4::BlockProgram prog(be, shape);
  const std::vector<int32_t> ids{1, 2, 3, 4}, labels{1, 2, 3, 4};
  const trex::dsv4::SeqLayout layout = trex::dsv4::SeqLayout::unpacked(1, 4);
  trex::dsv4::MicroBatch mb;
  mb.ids = ids.data(), mb.labels = labels.data(), mb.layout = &layout;
  mb.loss_scale = 0.5, mb.mtp_weight = 0.25, mb.balance_alpha = 1e-4;
  const double total = prog.forward(mb).total;
  EXPECT_DOUBLE_EQ(total, 3.0 + 0.25 * 2.0 + 1.0);
  std::vector<std::string> want{"begin train", "embed X0"};
  append(want, block_fwd(0, "X0", "X1", true, false));
  want.push_back("release 0");
  append(want, block_fwd(1, "X1", "X2", false, false));
  want.push_back("release 1");
  append(want, {"head X2", "mtp_in X2>MtpIn"});
  append(want, block_fwd(2, "MtpIn", "MtpOut", true, false));
  append(want, {"release 2", "mtp_head MtpOut"});
  EXPECT_EQ(be.log, want);

  // A replay: the block's forward without its last expand, the MoE told it replays.
  auto replay = [](int b, const std::string& in, bool balance) {
    std::vector<std::string> v = block_fwd(b, in, "-", balance, false);
    v.pop_back();  // the ffn expand
    v[4] = "moe replay " + std::to_string(b);
    return v;
  };
  be.log.clear();
  prog.backward(0, nullptr, nullptr);
  want = {"mtp_head_bwd MtpOut =dMtpOut w12"};
  append(want, replay(2, "MtpIn", true));
  append(want, block_bwd(2, "MtpIn", "dMtpOut", "dMtpIn"));
  append(want, {"release 2", "mtp_in_bwd X2 dMtpIn =dA", "head_bwd X2 +dA w50"});
  append(want, replay(1, "X1", false));
  append(want, block_bwd(1, "X1", "dA", "dB"));
  want.push_back("release 1");
  append(want, replay(0, "X0", true));
  append(want, block_bwd(0, "X0", "dB", "dA"));
  append(want, {"release 0", "embed_bwd dA"});
  EXPECT_EQ(be.log, want);
  EXPECT_DOUBLE_EQ(prog.losses(0).total, total);
}

TEST(BlockProgram, MiddlePipelineStageTakesAndGivesStreams) {
  Recorder be;
  trex::dsv4::ProgramShape shape;
  shape.n_layers = 1, shape.embed = false, shape.head = false, shape.vocab = 10, shape.balance = {0};
  trex::dsv4::BlockProgram prog(be, shape);
  const std::vector<int32_t> ids{1, 2};
  const trex::dsv4::SeqLayout layout = trex::dsv4::SeqLayout::unpacked(1, 2);
  float x_in = 0, x_out = 0;
  trex::dsv4::MicroBatch mb;
  mb.ids = ids.data(), mb.layout = &layout, mb.x_in = &x_in, mb.x_out = &x_out;
  prog.forward(mb);
  std::vector<std::string> want{"begin train", "in X0"};
  append(want, block_fwd(0, "X0", "X1", false, false));
  want.push_back("out X1");
  EXPECT_EQ(be.log, want);
  be.log.clear();
  EXPECT_THROW(prog.backward(0, nullptr, &x_in), trex::Error);  // no gradient of the outgoing stream
  prog.backward(0, &x_out, &x_in);
  want = {"in dA"};
  append(want, block_bwd(0, "X0", "dA", "dB"));
  want.push_back("out dB");
  EXPECT_EQ(be.log, want);
}

TEST(BlockProgram, DecodeIsTheSameBlocksWithTheCachedAttentionAndNoLoss) {
  Recorder be;
  trex::dsv4::ProgramShape shape;
  shape.n_layers = 2, shape.mtp = true, shape.vocab = 10, shape.balance = {1, 1, 1};
  trex::dsv4::BlockProgram prog(be, shape);
  const std::vector<int32_t> ids{5, 6, 7};
  const std::vector<int64_t> pos{0, 1, 9}, seq{0, 0, 1}, seq_begin{0, 2, 3}, rows{1, 2};
  std::vector<SequenceCaches*> caches{nullptr, nullptr};
  const trex::dsv4::CachedTokens tokens{pos.data(), seq.data(), seq_begin.data(), 2, caches.data()};
  std::vector<float> logits(20);
  prog.decode(ids.data(), tokens, 3, rows.data(), 2, logits.data());
  std::vector<std::string> want{"begin decode", "embed X0"};
  append(want, block_fwd(0, "X0", "X1", false, true));
  append(want, block_fwd(1, "X1", "X2", false, true));
  want.push_back("logits X2 rows 2");
  EXPECT_EQ(be.log, want);  // no balance, no MTP block, no loss
}

}  // namespace
