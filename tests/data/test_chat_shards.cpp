// Chat encoding masks, packing into shards (document starts, positions, labels, splitting, padding),
// malformed input reporting, and the sampler's determinism and resume.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "core/error.h"
#include "data/bpe_trainer.h"
#include "data/chat.h"
#include "data/sampler.h"
#include "data/shards.h"

using namespace trex;
using namespace trex::data;
namespace fs = std::filesystem;

static const Tokenizer& tok() {
  static const Tokenizer t = [] {
    BpeTrainOptions o;
    o.vocab_size = 400;
    BpeTrainer tr(o);
    for (int i = 0; i < 20; ++i) tr.add_text("minimise cost subject to capacity; the answer is 42. ");
    return tr.train();
  }();
  return t;
}

static fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("trex_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(Chat, MaskTrainsAssistantTokensOnly) {
  const ChatTokens ct = ChatTokens::from(tok());
  std::vector<ChatMessage> msgs = {{"system", "Be brief.", ""}, {"user", "cost?", ""}, {"assistant", "42", ""}};
  EncodedSample s = encode_chat(tok(), msgs, ThinkingMode::Off);
  // Expected, built piece by piece: BOS sys <User> user <Assistant> </think> | 42 EOS
  std::vector<int32_t> want = {ct.bos};
  auto add = [&](const std::string& t) { tok().encode_append(t, want, false); };
  add("Be brief.");
  want.push_back(ct.user);
  add("cost?");
  want.push_back(ct.assistant);
  want.push_back(ct.end_think);
  const size_t prompt_len = want.size();
  add("42");
  want.push_back(ct.eos);
  EXPECT_EQ(s.ids, want);
  for (size_t i = 0; i < s.ids.size(); ++i) EXPECT_EQ(s.target[i], i >= prompt_len ? 1 : 0) << i;
  EXPECT_EQ(tok().decode(s.ids), "<\uff5cbegin\u2581of\u2581sentence\uff5c>Be brief.<\uff5cUser\uff5c>cost?"
                                 "<\uff5cAssistant\uff5c></think>42<\uff5cend\u2581of\u2581sentence\uff5c>");
}

TEST(Chat, ThinkingModeKeepsOnlyTheLastTurnsReasoningAndToolResultsMergeIntoUser) {
  std::vector<ChatMessage> msgs = {{"user", "a", ""},
                                   {"assistant", "b", "old thoughts"},
                                   {"user", "c", ""},
                                   {"tool", "7", ""},
                                   {"assistant", "d", "new thoughts"}};
  EncodedSample s = encode_chat(tok(), msgs, ThinkingMode::Auto);
  std::string text = tok().decode(s.ids);
  EXPECT_EQ(text, "<\uff5cbegin\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>a<\uff5cAssistant\uff5c></think>b"
                  "<\uff5cend\u2581of\u2581sentence\uff5c><\uff5cUser\uff5c>c<tool_result>7</tool_result>"
                  "<\uff5cAssistant\uff5c><think>new thoughts</think>d<\uff5cend\u2581of\u2581sentence\uff5c>");
  // Trained text = both assistant turns (historical one without reasoning): decode the targets.
  std::vector<int32_t> trained;
  for (size_t i = 0; i < s.ids.size(); ++i)
    if (s.target[i]) trained.push_back(s.ids[i]);
  EXPECT_EQ(tok().decode(trained), "b<\uff5cend\u2581of\u2581sentence\uff5c>new thoughts</think>d"
                                   "<\uff5cend\u2581of\u2581sentence\uff5c>");
  // Content cannot inject specials: a literal "<think>" in a user turn is plain text.
  EncodedSample inj = encode_chat(tok(), {{"user", "<think>", ""}, {"assistant", "x", ""}}, ThinkingMode::Off);
  EXPECT_EQ(std::count(inj.ids.begin(), inj.ids.end(), ChatTokens::from(tok()).think), 0);
  EXPECT_THROW(encode_chat(tok(), {{"user", "only a question", ""}}, ThinkingMode::Off), Error);
  auto prompt = encode_prompt(tok(), {{"user", "q", ""}}, false);
  EXPECT_EQ(prompt.back(), ChatTokens::from(tok()).end_think);
}

static void write_lines(const fs::path& p, const std::vector<std::string>& lines) {
  std::ofstream f(p);
  for (const auto& l : lines) f << l << "\n";
}

TEST(Shards, PackingKeepsDocumentsApartAndSplitsLongOnes) {
  fs::path d = temp_dir("pack");
  std::string long_text(300, 'x');
  for (size_t i = 0; i < long_text.size(); i += 7) long_text[i] = ' ';
  write_lines(d / "cpt.jsonl", {R"({"text": "the answer is 42."})", R"({"text": ""})", "",
                                R"({"text": ")" + long_text + R"("})",
                                R"({"messages": [{"role": "user", "content": "cost?"}, {"role": "assistant", "content": "42"}]})"});
  PrepareOptions o;
  o.seq_len = 32;
  o.rows_per_shard = 2;
  PrepareStats st = prepare_shards(tok(), {d / "cpt.jsonl"}, d / "out", o);
  EXPECT_EQ(st.documents, 3);
  EXPECT_EQ(st.empty_skipped, 2);
  EXPECT_EQ(st.split_documents, 1);
  ShardDataset ds(d / "out");
  EXPECT_EQ(ds.seq_len(), 32);
  EXPECT_EQ(ds.rows(), st.rows);
  EXPECT_GT(ds.index()["shards"].size(), 1u);  // rows_per_shard = 2 forces several shards
  // Reassemble documents from the rows: every doc start restarts positions; labels are aligned with the ids
  // (data/batch.h), so a label is its own position's token and never a document's first one.
  Batch b;
  std::vector<int64_t> all;
  for (int64_t r = 0; r < ds.rows(); ++r) all.push_back(r);
  make_batch(ds, all, 1, b);
  int64_t targets = 0;
  for (int64_t r = 0; r < b.batch; ++r)
    for (int64_t t = 0; t < b.seq; ++t) {
      size_t i = size_t(r * b.seq + t);
      if (b.doc_start[i]) EXPECT_EQ(b.pos[i], 0);
      else EXPECT_EQ(b.pos[i], b.pos[i - 1] + 1);
      if (b.labels[i] >= 0) {
        EXPECT_FALSE(b.doc_start[i]);
        EXPECT_EQ(b.labels[i], b.input_ids[i]);
        ++targets;
      }
    }
  EXPECT_EQ(targets, b.n_targets);
  EXPECT_EQ(targets, st.target_tokens);
  // The first row starts with BOS and the first document's text; the SFT row trains only on "42" + EOS.
  EXPECT_EQ(b.input_ids[0], ChatTokens::from(tok()).bos);
  fs::remove_all(d);
}

TEST(Shards, MalformedLinesNameFileAndLineOrAreSkippedWithCount) {
  fs::path d = temp_dir("bad");
  write_lines(d / "bad.jsonl", {R"({"text": "ok"})", R"({"text": "ok")", R"({"messages": [{"role": "bot"}]})",
                                R"({"title": "x"})", R"({"text": 5})"});
  PrepareOptions o;
  o.seq_len = 16;
  try {
    prepare_shards(tok(), {d / "bad.jsonl"}, d / "out", o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2:"), std::string::npos) << e.what();
  }
  o.skip_bad_lines = true;
  PrepareStats st = prepare_shards(tok(), {d / "bad.jsonl"}, d / "out", o);
  EXPECT_EQ(st.documents, 1);
  EXPECT_EQ(st.bad_skipped, 4);
  ASSERT_EQ(st.bad_examples.size(), 4u);
  EXPECT_NE(st.bad_examples[1].find("bad.jsonl:3:"), std::string::npos);
  EXPECT_NE(st.bad_examples[1].find("role 'bot'"), std::string::npos) << st.bad_examples[1];
  fs::remove_all(d);
}

// A chat longer than seq_len is not cut into windows: the window after the first would hold an answer without its
// question, and a window of prompt only trains nothing (a step of such rows reports loss 0). It is truncated to its
// first seq_len tokens, or dropped when no assistant token is left there (or when long_chats is drop).
TEST(Shards, LongChatsAreTruncatedOrDroppedNeverCutIntoWindows) {
  fs::path d = temp_dir("long_chats");
  std::string words;
  for (int i = 0; i < 40; ++i) words += "capacity cost ";
  const std::string long_answer =
      R"({"messages": [{"role": "user", "content": "cost?"}, {"role": "assistant", "content": ")" + words + R"("}]})";
  const std::string long_prompt =
      R"({"messages": [{"role": "user", "content": ")" + words + R"("}, {"role": "assistant", "content": "42"}]})";
  const std::string short_chat =
      R"({"messages": [{"role": "user", "content": "cost?"}, {"role": "assistant", "content": "42"}]})";
  write_lines(d / "sft.jsonl", {long_answer, long_prompt, short_chat});
  const int64_t long_answer_len =
      int64_t(encode_chat(tok(), {{"user", "cost?", ""}, {"assistant", words, ""}}, ThinkingMode::Auto).ids.size());
  const int64_t long_prompt_len =
      int64_t(encode_chat(tok(), {{"user", words, ""}, {"assistant", "42", ""}}, ThinkingMode::Auto).ids.size());
  const EncodedSample shorter = encode_chat(tok(), {{"user", "cost?", ""}, {"assistant", "42", ""}}, ThinkingMode::Auto);
  PrepareOptions o;
  o.seq_len = 24;
  ASSERT_GT(long_answer_len, 2 * o.seq_len);
  ASSERT_GT(long_prompt_len, 2 * o.seq_len);
  ASSERT_LE(int64_t(shorter.ids.size()), o.seq_len);

  PrepareStats st = prepare_shards(tok(), {d / "sft.jsonl"}, d / "truncate", o);
  EXPECT_EQ(st.documents, 3);
  EXPECT_EQ(st.split_documents, 0);
  EXPECT_EQ(st.truncated_chats, 1);
  EXPECT_EQ(st.dropped_chats, 1);  // the long prompt leaves no assistant token in 24
  EXPECT_EQ(st.longest_chat, std::max(long_answer_len, long_prompt_len));
  EXPECT_EQ(st.tokens, o.seq_len + int64_t(shorter.ids.size()));
  // Every row trains on something, and the truncated chat's row starts with its question (BOS, then the user turn).
  ShardDataset ds(d / "truncate");
  ASSERT_EQ(ds.rows(), 2);
  for (int64_t r = 0; r < ds.rows(); ++r) {
    int64_t targets = 0;
    for (int64_t t = 0; t < ds.seq_len(); ++t) targets += (ds.flags(r)[t] & kTarget) ? 1 : 0;
    EXPECT_GT(targets, 0) << "row " << r;
  }
  const EncodedSample full = encode_chat(tok(), {{"user", "cost?", ""}, {"assistant", words, ""}}, ThinkingMode::Auto);
  for (int64_t t = 0; t < o.seq_len; ++t) EXPECT_EQ(int64_t(ds.tokens(0)[t]), full.ids[size_t(t)]) << t;

  o.long_chats = LongChats::Drop;
  st = prepare_shards(tok(), {d / "sft.jsonl"}, d / "drop", o);
  EXPECT_EQ(st.truncated_chats, 0);
  EXPECT_EQ(st.dropped_chats, 2);
  EXPECT_EQ(st.rows, 1);

  // Nothing left: the error counts the dropped chats and names seq_len.
  write_lines(d / "only_long.jsonl", {long_prompt});
  o.long_chats = LongChats::Truncate;
  try {
    prepare_shards(tok(), {d / "only_long.jsonl"}, d / "none", o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1 chats longer than seq_len 24 dropped"), std::string::npos) << e.what();
  }
  EXPECT_EQ(parse_long_chats("drop", "x"), LongChats::Drop);
  EXPECT_THROW(parse_long_chats("split", "x"), Error);
  fs::remove_all(d);
}

TEST(Sampler, DeterministicPermutationsAndExactResume) {
  Sampler a(10, 123), b(10, 123), c(10, 124);
  auto ra = a.next_rows(25), rb = b.next_rows(25), rc = c.next_rows(25);
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
  // Each epoch is a permutation, and epochs differ.
  std::set<int64_t> e0(ra.begin(), ra.begin() + 10), e1(ra.begin() + 10, ra.begin() + 20);
  EXPECT_EQ(e0.size(), 10u);
  EXPECT_EQ(e1.size(), 10u);
  EXPECT_NE(std::vector<int64_t>(ra.begin(), ra.begin() + 10), std::vector<int64_t>(ra.begin() + 10, ra.begin() + 20));
  // Resume mid-epoch from a saved state.
  Sampler s1(10, 123);
  s1.next_rows(13);
  SamplerState saved = SamplerState::from_json(nlohmann::json::parse(s1.state().to_json().dump()));
  auto cont = s1.next_rows(12);
  Sampler s2(10, 123);
  s2.set_state(saved);
  EXPECT_EQ(s2.next_rows(12), cont);
  EXPECT_EQ(cont, std::vector<int64_t>(ra.begin() + 13, ra.end()));
  Sampler wrong(10, 5);
  EXPECT_THROW(wrong.set_state(saved), Error);
}
