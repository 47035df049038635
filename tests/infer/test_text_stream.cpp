// TextStream: UTF-8 safe deltas, reasoning/content split at </think>, stop strings across deltas.
#include <gtest/gtest.h>

#include "infer/text_stream.h"

using namespace trex::infer;

namespace {

// Token i decodes to pieces[i] (raw bytes; a piece may be half of a UTF-8 character).
TextStream::Decode piece_decoder(std::vector<std::string> pieces) {
  return [pieces](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t i : ids) s += pieces.at(size_t(i));
    return s;
  };
}

std::string stream_all(TextStream& ts, const std::vector<int32_t>& ids, std::string* reasoning = nullptr) {
  std::string out, r;
  for (int32_t id : ids) {
    const TextDelta d = ts.push({id});
    out += d.content;
    r += d.reasoning;
    for (unsigned char c : d.content) EXPECT_NE(c, 0xE2) << "a delta ended inside a UTF-8 character";
  }
  const TextDelta d = ts.finish();
  out += d.content;
  r += d.reasoning;
  if (reasoning) *reasoning = r;
  return out;
}

TEST(TextStream, NeverSplitsUtf8Characters) {
  // "→" is E2 86 92: split over three tokens.
  TextStream ts(piece_decoder({"a", "\xE2", "\x86", "\x92", "b"}), {}, -1);
  EXPECT_EQ(ts.push({0}).content, "a");
  EXPECT_EQ(ts.push({1}).content, "");
  EXPECT_EQ(ts.push({2}).content, "");
  EXPECT_EQ(ts.push({3}).content, "\xE2\x86\x92");
  EXPECT_EQ(ts.push({4}).content, "b");
  EXPECT_EQ(utf8_complete_prefix("x\xE2\x86"), 1u);
  EXPECT_EQ(utf8_complete_prefix("x\xE2\x86\x92"), 4u);
}

TEST(TextStream, SplitsReasoningFromContentAtEndThink) {
  TextStream ts(piece_decoder({"think ", "more", "</think>", "answer"}), {}, 2);
  std::string reasoning;
  EXPECT_EQ(stream_all(ts, {0, 1, 2, 3}, &reasoning), "answer");
  EXPECT_EQ(reasoning, "think more");
  EXPECT_EQ(ts.reasoning(), "think more");
  EXPECT_EQ(ts.content(), "answer");
}

TEST(TextStream, StopStringCutsTheContentEvenAcrossDeltas) {
  TextStream ts(piece_decoder({"Hello ", "wor", "ld", "!", " more"}), {"world!", "zzz"}, -1);
  EXPECT_EQ(stream_all(ts, {0, 1, 2, 3, 4}), "Hello ");
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(ts.content(), "Hello ");
  TextStream none(piece_decoder({"Hello ", "wor", "ld"}), {"world!"}, -1);
  EXPECT_EQ(stream_all(none, {0, 1, 2}), "Hello world");  // held-back text is released at the end
  EXPECT_FALSE(none.stopped());
}

}  // namespace
