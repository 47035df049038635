// The OpenAI API surface of `trex serve` against references computed here with the decoder directly:
// /v1/completions (text, ids, several prompts), logprobs / top_logprobs on both endpoints (the model's
// log-softmax, teacher-forced), n > 1 (choice j equals the n = 1 request with seed + j: the prompt caches
// copied between slots decode exactly as a fresh prefill), stop strings across token boundaries,
// presence / frequency penalties (a greedy decode with the penalties applied by hand), 404 for an unknown
// model; streamed responses equal the non-streamed ones.
#ifdef TREX_HAVE_HTTPLIB
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "infer/decoder.h"
#include "infer/sampler.h"
#include "server_test_util.h"

using namespace trex;
using namespace trex::infer;
using json = nlohmann::json;

namespace {

class ServerApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { s_ = new test::TinyServer(); }
  static void TearDownTestSuite() {
    delete s_;
    s_ = nullptr;
  }
  static json ok(const std::string& path, const json& body) {
    auto r = s_->post(path, body);
    EXPECT_TRUE(r);
    if (!r) return json::object();
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  }
  static std::vector<json> stream(const std::string& path, json body) {
    body["stream"] = true;
    auto r = s_->post(path, body);
    EXPECT_TRUE(r && r->status == 200);
    bool done = false;
    auto ev = test::sse_events(r ? r->body : "", &done);
    EXPECT_TRUE(done);
    return ev;
  }
  // Teacher-forced logits of every position of `ids`.
  static std::vector<float> forced_logits(const std::vector<int32_t>& ids) {
    Decoder dec(*s_->model, test::TinyServer::kContext);
    auto seq = dec.new_sequence();
    std::vector<float> logits;
    dec.step(*seq, ids, logits, true);
    return logits;
  }
  static std::vector<int32_t> ids_of(const json& choice) { return choice["token_ids"].get<std::vector<int32_t>>(); }
  static std::vector<int32_t> text_ids(const std::string& text) {
    std::vector<int32_t> ids = {int32_t(s_->model->config().bos_token_id)};
    s_->tok->encode_append(text, ids, false);
    return ids;
  }
  // Text as the JSON responses carry it (bytes that are not UTF-8 become U+FFFD).
  static std::string as_sent(const std::string& bytes) {
    return json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
  }
  static inline test::TinyServer* s_ = nullptr;
};

const std::string kPrompt = "the optimal solution of each warehouse";

TEST_F(ServerApiTest, CompletionsTakeTextIdsAndListsAndMatchTheChatPathOnTheSameIds) {
  const std::vector<int32_t> ids = text_ids(kPrompt);
  const json a = ok("/v1/completions", {{"model", "tiny"}, {"prompt", kPrompt}, {"max_tokens", 6}, {"temperature", 0}});
  EXPECT_EQ(a["object"], "text_completion");
  EXPECT_EQ(a["usage"]["prompt_tokens"], int64_t(ids.size()));
  const json b = ok("/v1/completions", {{"prompt", ids}, {"max_tokens", 6}, {"temperature", 0}});
  const json c = ok("/v1/chat/completions", {{"prompt_token_ids", ids}, {"max_tokens", 6}, {"temperature", 0}});
  EXPECT_EQ(ids_of(a["choices"][0]), ids_of(b["choices"][0]));
  EXPECT_EQ(ids_of(a["choices"][0]), ids_of(c["choices"][0]));
  EXPECT_EQ(a["choices"][0]["text"], c["choices"][0]["message"]["content"]);
  // The text is the decoded ids (bytes that are not UTF-8 arrive as U+FFFD).
  const std::string decoded = s_->tok->decode(ids_of(a["choices"][0]));
  EXPECT_EQ(json::parse(json(decoded).dump(-1, ' ', false, json::error_handler_t::replace)), a["choices"][0]["text"]);
  // A list of prompts: one choice each, in order.
  const json l = ok("/v1/completions", {{"prompt", json::array({kPrompt, "demand"})}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(l["choices"].size(), 2u);
  EXPECT_EQ(l["choices"][0]["index"], 0);
  EXPECT_EQ(l["choices"][1]["index"], 1);
  const json one = ok("/v1/completions", {{"prompt", "demand"}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(ids_of(l["choices"][1]), ids_of(one["choices"][0]));
  const std::vector<int32_t> a_ids = ids_of(a["choices"][0]);
  EXPECT_EQ(ids_of(l["choices"][0]), std::vector<int32_t>(a_ids.begin(), a_ids.begin() + 4));
  EXPECT_EQ(l["usage"]["prompt_tokens"], int64_t(ids.size() + text_ids("demand").size()));
  const json ll = ok("/v1/completions", {{"prompt", json::array({ids, text_ids("demand")})}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(ids_of(ll["choices"][1]), ids_of(one["choices"][0]));
}

TEST_F(ServerApiTest, LogprobsAreTheModelsLogSoftmaxInBothFormats) {
  const std::vector<int32_t> prompt = text_ids(kPrompt);
  for (const bool chat : {true, false}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    json body = {{"max_tokens", 5}, {"temperature", 0.9}, {"seed", 4}, {"ignore_eos", true}};
    if (chat) {
      body["prompt_token_ids"] = prompt;
      body["logprobs"] = true;
      body["top_logprobs"] = 3;
    } else {
      body["prompt"] = prompt;
      body["logprobs"] = 3;
    }
    const json j = ok(chat ? "/v1/chat/completions" : "/v1/completions", body);
    const json& ch = j["choices"][0];
    const std::vector<int32_t> gen = ids_of(ch);
    ASSERT_EQ(gen.size(), 5u);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), gen.begin(), gen.end());
    const std::vector<float> lg = forced_logits(all);
    const int64_t V = s_->model->config().vocab_size;
    int64_t offset = 0;
    for (size_t k = 0; k < gen.size(); ++k) {
      const TokenLogprob ref = token_logprob(lg.data() + int64_t(prompt.size() + k - 1) * V, V, gen[k], 3);
      const std::string text = s_->tok->decode({gen[k]});
      if (chat) {
        const json& e = ch["logprobs"]["content"][k];
        EXPECT_NEAR(e["logprob"].get<double>(), ref.logprob, 1e-3);
        EXPECT_EQ(e["bytes"].size(), text.size());
        ASSERT_EQ(e["top_logprobs"].size(), 3u);
        for (size_t t = 0; t < 3; ++t) {
          EXPECT_NEAR(e["top_logprobs"][t]["logprob"].get<double>(), ref.top[t].second, 1e-3);
          EXPECT_EQ(e["top_logprobs"][t]["bytes"].size(), s_->tok->decode({ref.top[t].first}).size());
        }
        EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["logprob"].get<double>() - 1e-6);
      } else {
        const json& L = ch["logprobs"];
        EXPECT_NEAR(L["token_logprobs"][k].get<double>(), ref.logprob, 1e-3);
        EXPECT_EQ(L["text_offset"][k], offset);
        EXPECT_GE(L["top_logprobs"][k].size(), 1u);
        EXPECT_LE(L["top_logprobs"][k].size(), 3u);
        offset += int64_t(text.size());
      }
    }
    if (!chat) {
      EXPECT_EQ(ch["logprobs"]["tokens"].size(), 5u);
    }
    // Streamed: the same entries, spread over the chunks.
    json lps = json::array();
    for (const json& e : stream(chat ? "/v1/chat/completions" : "/v1/completions", body)) {
      if (e["choices"].empty() || e["choices"][0]["logprobs"].is_null()) continue;
      const json& L = e["choices"][0]["logprobs"];
      if (chat) {
        for (const auto& x : L["content"]) lps.push_back(x["logprob"]);
      } else {
        for (const auto& x : L["token_logprobs"]) lps.push_back(x);
      }
    }
    ASSERT_EQ(lps.size(), 5u);
    for (size_t k = 0; k < 5; ++k)
      EXPECT_EQ(lps[k], chat ? ch["logprobs"]["content"][k]["logprob"] : ch["logprobs"]["token_logprobs"][k]);
  }
}

TEST_F(ServerApiTest, NChoicesShareThePromptAndEachEqualsItsSeededSoloRun) {
  const std::vector<int32_t> prompt = text_ids(kPrompt);
  json body = {{"prompt_token_ids", prompt}, {"max_tokens", 7}, {"temperature", 1.0}, {"seed", 10}, {"n", 3}, {"ignore_eos", true}};
  const json j = ok("/v1/chat/completions", body);
  ASSERT_EQ(j["choices"].size(), 3u);
  EXPECT_EQ(j["usage"]["prompt_tokens"], int64_t(prompt.size()));  // prefilled once
  EXPECT_EQ(j["usage"]["completion_tokens"], 21);
  std::set<std::vector<int32_t>> distinct;
  for (int64_t c = 0; c < 3; ++c) {
    json solo = body;
    solo["n"] = 1;
    solo["seed"] = 10 + c;
    const json s = ok("/v1/chat/completions", solo);
    EXPECT_EQ(j["choices"][c]["index"], c);
    EXPECT_EQ(ids_of(j["choices"][c]), ids_of(s["choices"][0])) << "choice " << c;
    distinct.insert(ids_of(j["choices"][c]));
  }
  EXPECT_GT(distinct.size(), 1u) << "different seeds should give different samples at temperature 1";
  // Streamed n = 3: each index's text equals the non-streamed choice.
  std::map<int64_t, std::string> text;
  std::map<int64_t, int> finals;
  for (const json& e : stream("/v1/chat/completions", body)) {
    if (e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) text[c["index"].get<int64_t>()] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finals[c["index"].get<int64_t>()];
  }
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(text[c], j["choices"][c]["message"]["content"].get<std::string>());
    EXPECT_EQ(finals[c], 1);
  }
  // Greedy n = 2 on completions: both equal the greedy completion.
  const json g = ok("/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"n", 2}});
  const json g1 = ok("/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}});
  ASSERT_EQ(g["choices"].size(), 2u);
  EXPECT_EQ(ids_of(g["choices"][0]), ids_of(g1["choices"][0]));
  EXPECT_EQ(ids_of(g["choices"][1]), ids_of(g1["choices"][0]));
}

TEST_F(ServerApiTest, StopStringsMatchAcrossTokenBoundariesAndAreNotReturned) {
  const std::vector<int32_t> prompt = text_ids(kPrompt);
  json body = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  const json full = ok("/v1/completions", body);
  const std::vector<int32_t> gen = ids_of(full["choices"][0]);
  ASSERT_EQ(gen.size(), 24u);
  // A stop string made of the end of one token's text and the start of the next one's.
  const std::string all = s_->tok->decode(gen);
  std::string stop;
  size_t at = 0;
  for (size_t k = 4; k + 1 < gen.size() && stop.empty(); ++k) {
    const std::string a = s_->tok->decode({gen[k]}), b = s_->tok->decode({gen[k + 1]});
    const size_t end_a = s_->tok->decode(std::vector<int32_t>(gen.begin(), gen.begin() + ptrdiff_t(k + 1))).size();
    if (a.empty() || b.empty()) continue;
    const std::string cand = a.substr(a.size() - 1) + b.substr(0, 1);
    if ((unsigned char)cand[0] >= 0x80 || (unsigned char)cand[1] >= 0x80) continue;  // whole characters
    if (all.find(cand) != end_a - 1) continue;  // its first match must be this boundary
    stop = cand;
    at = end_a - 1;
  }
  ASSERT_FALSE(stop.empty()) << "no two-byte stop string across a token boundary in this completion";
  body["stop"] = json::array({"\x01never", stop});
  const json j = ok("/v1/completions", body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const std::string expected = as_sent(all.substr(0, at));
  EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), expected);
  std::string streamed;
  std::string reason;
  for (const json& e : stream("/v1/completions", body)) {
    if (e["choices"].empty()) continue;
    streamed += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) reason = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(as_sent(streamed), expected);
  EXPECT_EQ(reason, "stop");
  // Chat, same ids: the same cut.
  json cb = {{"prompt_token_ids", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}, {"stop", stop}};
  EXPECT_EQ(ok("/v1/chat/completions", cb)["choices"][0]["message"]["content"].get<std::string>(), expected);
}

TEST_F(ServerApiTest, PenaltiesMatchAGreedyDecodeWithThePenaltiesAppliedByHand) {
  const std::vector<int32_t> prompt = text_ids(kPrompt);
  const double pres = 0.7, freq = 1.3;
  const json j = ok("/v1/completions", {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true},
                                        {"presence_penalty", pres}, {"frequency_penalty", freq}});
  Decoder dec(*s_->model, test::TinyServer::kContext);
  auto seq = dec.new_sequence();
  const int64_t V = s_->model->config().vocab_size;
  std::vector<float> logits;
  dec.step(*seq, prompt, logits);
  std::vector<int32_t> ref;
  std::map<int32_t, int> seen;
  for (int k = 0; k < 12; ++k) {
    for (const auto& [t, c] : seen) logits[size_t(t)] -= float(freq * c + pres);
    const int32_t t = argmax(logits.data(), V);
    ref.push_back(t);
    ++seen[t];
    dec.step(*seq, {t}, logits);
  }
  EXPECT_EQ(ids_of(j["choices"][0]), ref);
  const json plain = ok("/v1/completions", {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}});
  std::set<int32_t> distinct_plain, distinct_pen;
  for (int32_t t : ids_of(plain["choices"][0])) distinct_plain.insert(t);
  for (int32_t t : ref) distinct_pen.insert(t);
  EXPECT_GE(distinct_pen.size(), distinct_plain.size()) << "penalised decoding should repeat itself less";
  auto r = s_->post("/v1/completions", {{"prompt", prompt}, {"presence_penalty", 2.5}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "presence_penalty");
}

TEST_F(ServerApiTest, SeedRepeatsAndAnUnknownModelIsA404) {
  const json body = {{"prompt", kPrompt}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 123}, {"ignore_eos", true}};
  const json a = ok("/v1/completions", body), b = ok("/v1/completions", body);
  EXPECT_EQ(ids_of(a["choices"][0]), ids_of(b["choices"][0]));
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    auto r = s_->post(path, {{"model", "gpt-4o"}, {"prompt", "x"}, {"messages", {{{"role", "user"}, {"content", "x"}}}}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << path;
    const json e = json::parse(r->body)["error"];
    EXPECT_EQ(e["code"], "model_not_found");
    EXPECT_EQ(e["param"], "model");
    EXPECT_EQ(e["type"], "invalid_request_error");
  }
}

}  // namespace
#endif  // TREX_HAVE_HTTPLIB
