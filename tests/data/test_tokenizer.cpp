// Tokenizer: regex pre-tokenization, BPE against hand-computed merges, added tokens, byte round trips,
// training, tokenizer.json round trip.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "data/bpe_trainer.h"
#include "data/pre_tokenizer.h"
#include "data/regex.h"
#include "data/tokenizer.h"
#include "data/unicode.h"

using namespace trex;
using namespace trex::data;
using json = nlohmann::json;

static std::string bl(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) unicode::append_utf8(s, byte_level_char(b));
  return s;
}

static std::vector<std::string> split_all(const std::string& pattern, const std::string& text) {
  json pre = {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
  std::vector<std::string> out;
  PreTokenizer::from_json(pre, "test")->split(text, out);
  return out;
}

TEST(Regex, Gpt2PatternSplitsWordsSpacesAndContractions) {
  const std::string gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(split_all(gpt2, "Hello world's  test 123!!\n"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " test", " 123", "!!", "\n"}));
  // Unicode letters (é, Greek, CJK) are \p{L}; the trailing spaces end as one \s+ piece.
  EXPECT_EQ(split_all(gpt2, "caf\u00e9 \u03b1\u03b2 \u4e2d\u6587   "),
            (std::vector<std::string>{"caf\u00e9", " \u03b1\u03b2", " \u4e2d\u6587", "   "}));
}

TEST(Regex, DeepSeekV3PreTokenizerSequence) {
  std::vector<std::string> out;
  PreTokenizer::from_json(PreTokenizer::deepseek_v3_json(), "test")->split("x=12345 abc\u4e2d\u6587def", out);
  // digits in runs of <= 3, then the CJK run isolated, then the word pattern.
  EXPECT_EQ(out, (std::vector<std::string>{"x", "=", "123", "45", " abc", "\u4e2d\u6587", "def"}));
}

TEST(Regex, QuantifiersLookaheadCaseInsensitiveAndErrors) {
  EXPECT_EQ(split_all("a{2,3}", "aaaaaaa"), (std::vector<std::string>{"aaa", "aaa", "a"}));
  EXPECT_EQ(split_all("(?i:ab)+", "xABabAbx"), (std::vector<std::string>{"x", "ABabAb", "x"}));
  EXPECT_EQ(split_all("a+?", "aa"), (std::vector<std::string>{"a", "a"}));
  EXPECT_EQ(split_all(R"(\d(?=x))", "1x2y3x"), (std::vector<std::string>{"1", "x2y", "3", "x"}));
  EXPECT_EQ(split_all("[^a-c]+", "abxyzc"), (std::vector<std::string>{"ab", "xyz", "c"}));
  try {
    re::Regex r("ab(c");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at character"), std::string::npos) << e.what();
  }
  EXPECT_THROW(re::Regex("\\p{Xx}"), Error);
  EXPECT_THROW(re::Regex("a++"), Error);
}

// A hand-written tokenizer.json: the 256 byte symbols, five merges, a special and a non-special added token.
static json hand_tokenizer() {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[bl(std::string(1, char(b)))] = id++;
  for (const char* t : {"he", "ll", "hell", "hello", "\xC4\xA0w"}) vocab[t] = id++;  // "Ġw" = " w"
  json merges = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w"};
  json added = {{{"id", 300}, {"content", "<|eos|>"}, {"special", true}},
                {{"id", 301}, {"content", "<tool>"}, {"special", false}, {"rstrip", true}}};
  return {{"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

TEST(Tokenizer, HandWrittenFileEncodesAsSpecified) {
  Tokenizer t = Tokenizer::from_json(hand_tokenizer(), "hand.json");
  const int32_t hello = 259, gw = 260, eos = 300, tool = 301;
  auto b = [](char c) { return int32_t(uint8_t(c)); };  // byte symbols have id = byte
  EXPECT_EQ(t.encode("hello world<|eos|>"), (std::vector<int32_t>{hello, gw, b('o'), b('r'), b('l'), b('d'), eos}));
  // "hell" merges via he + ll, "helo" can't use "ll": h e -> he, then he, l, o stay.
  EXPECT_EQ(t.encode("helo"), (std::vector<int32_t>{256, b('l'), b('o')}));
  // rstrip: the spaces after <tool> belong to the token.
  EXPECT_EQ(t.encode("x<tool>   y"), (std::vector<int32_t>{b('x'), tool, b('y')}));
  // Specials can be switched off for data content; non-special added tokens still match.
  auto plain = t.encode("a<|eos|>", false);
  EXPECT_EQ(plain.size(), 8u);
  EXPECT_EQ(t.decode(plain), "a<|eos|>");
  EXPECT_EQ(t.decode({hello, gw, eos}, true), "hello w");
  EXPECT_EQ(t.vocab_size(), 302);
  EXPECT_TRUE(t.is_special(eos));
  EXPECT_FALSE(t.is_special(tool));
  // to_json -> from_json gives the same tokenizer.
  Tokenizer t2 = Tokenizer::from_json(t.to_json(), "again");
  EXPECT_EQ(t2.encode("hello world<|eos|> <tool> hell"), t.encode("hello world<|eos|> <tool> hell"));
}

TEST(Tokenizer, ArbitraryBytesAndInvalidUtf8RoundTrip) {
  Tokenizer t = Tokenizer::from_json(hand_tokenizer(), "hand.json");
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(size_t(rng() % 64), '\0');
    for (auto& c : s) c = char(rng() % 256);
    EXPECT_EQ(t.decode(t.encode(s, false)), s);
  }
  const std::string tricky = "\xff\xfe \xc3( \xe2\x82 \xf0\x9f\x98\x80 hello \xed\xa0\x80 \xc0\xaf";
  EXPECT_EQ(t.decode(t.encode(tricky)), tricky);
}

TEST(Tokenizer, RejectsUnsupportedFilesWithTheFileName) {
  json j = hand_tokenizer();
  j["normalizer"] = {{"type", "NFC"}};
  try {
    Tokenizer::from_json(j, "weird.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weird.json"), std::string::npos);
  }
  j = hand_tokenizer();
  j["model"]["merges"].push_back("q zz");
  EXPECT_THROW(Tokenizer::from_json(j, "bad-merge.json"), Error);
}

// Ids are checked before they are narrowed to int32 or used to size the tables: 2^32 + 7 must not become 7,
// and a huge id must not allocate a huge table.
TEST(Tokenizer, RejectsOutOfRangeTokenIdsNamingTheEntry) {
  auto expect_rejected = [](const json& j, const std::string& what) {
    try {
      Tokenizer::from_json(j, "ids.json");
      FAIL() << "expected an error for " << what;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("ids.json"), std::string::npos) << m;
      EXPECT_NE(m.find(what), std::string::npos) << m;
    }
  };
  json j = hand_tokenizer();
  j["added_tokens"][0]["id"] = (int64_t(1) << 32) + 7;
  expect_rejected(j, "<|eos|>");
  j = hand_tokenizer();
  j["added_tokens"][1]["id"] = -3;
  expect_rejected(j, "<tool>");
  j = hand_tokenizer();
  j["added_tokens"][1]["id"] = 1.5;
  expect_rejected(j, "<tool>");
  j = hand_tokenizer();
  j["model"]["vocab"]["hello"] = uint64_t(1) << 63;
  expect_rejected(j, "'hello'");
  j = hand_tokenizer();
  j["model"]["vocab"]["hello"] = int64_t(1) << 40;
  expect_rejected(j, "'hello'");
  // The unmodified file still loads, with its ids as written.
  EXPECT_EQ(Tokenizer::from_json(hand_tokenizer(), "ids.json").token_to_id("<|eos|>"), 300);
}

TEST(BpeTrainer, LearnsFrequentPairsAndRoundTrips) {
  BpeTrainOptions o;
  o.vocab_size = int64_t(dsv4_special_tokens().size()) + 256 + 40;
  BpeTrainer tr(o);
  for (int i = 0; i < 50; ++i) tr.add_text("the minimum cost flow problem minimises the total cost of flow. ");
  tr.add_text("rare words appear once");
  Tokenizer t = tr.train();
  EXPECT_EQ(t.special_id("<\uff5cbegin\u2581of\u2581sentence\uff5c>"), 0);
  EXPECT_EQ(t.special_id("<\uff5cend\u2581of\u2581sentence\uff5c>"), 1);
  EXPECT_LE(t.vocab_size(), o.vocab_size);
  EXPECT_GT(t.vocab_size(), int64_t(dsv4_special_tokens().size()) + 256);
  // Frequent words become single tokens.
  EXPECT_EQ(t.encode(" cost").size(), 1u);
  EXPECT_EQ(t.encode(" flow").size(), 1u);
  const std::string s = "the minimum cost flow \xff\xfe <think> \u4e2d";
  EXPECT_EQ(t.decode(t.encode(s)), s);
  EXPECT_EQ(t.encode("<think>"), std::vector<int32_t>{t.special_id("<think>")});
  // Saved and reloaded through tokenizer.json: identical ids.
  Tokenizer t2 = Tokenizer::from_json(json::parse(t.to_json().dump()), "saved");
  EXPECT_EQ(t2.encode(s), t.encode(s));
  // Deterministic: a second training gives the same merges.
  BpeTrainer tr2(o);
  for (int i = 0; i < 50; ++i) tr2.add_text("the minimum cost flow problem minimises the total cost of flow. ");
  tr2.add_text("rare words appear once");
  EXPECT_EQ(tr2.train().to_json().dump(), t.to_json().dump());
}
