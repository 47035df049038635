#include "data/chat.h"

#include "core/error.h"

namespace trex::data {

using json = nlohmann::json;

ChatTokens ChatTokens::from(const Tokenizer& t) {
  return {t.special_id("<\uff5cbegin\u2581of\u2581sentence\uff5c>"), t.special_id("<\uff5cend\u2581of\u2581sentence\uff5c>"),
          t.special_id("<\uff5cUser\uff5c>"), t.special_id("<\uff5cAssistant\uff5c>"), t.special_id("<think>"),
          t.special_id("</think>")};
}

std::vector<ChatMessage> parse_messages(const json& messages, const std::string& where) {
  TREX_CHECK(messages.is_array(), "{}: 'messages' must be a list", where);
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    TREX_CHECK(m.is_object(), "{}: messages[{}] is not an object", where, i);
    TREX_CHECK(m.contains("role") && m["role"].is_string(), "{}: messages[{}] has no string 'role'", where, i);
    ChatMessage c;
    c.role = m["role"].get<std::string>();
    TREX_CHECK(c.role == "system" || c.role == "user" || c.role == "developer" || c.role == "tool" ||
                   c.role == "assistant",
               "{}: messages[{}].role '{}' (expected system, user, developer, tool or assistant)", where, i, c.role);
    if (m.contains("content") && !m["content"].is_null()) {
      TREX_CHECK(m["content"].is_string(), "{}: messages[{}].content must be a string", where, i);
      c.content = m["content"].get<std::string>();
    }
    for (const char* k : {"reasoning_content", "reasoning"})
      if (m.contains(k) && !m[k].is_null()) {
        TREX_CHECK(m[k].is_string(), "{}: messages[{}].{} must be a string", where, i, k);
        TREX_CHECK(c.role == "assistant", "{}: messages[{}]: only assistant turns carry reasoning", where, i);
        c.reasoning = m[k].get<std::string>();
      }
    TREX_CHECK(!m.contains("tool_calls"), "{}: messages[{}]: tool_calls are not supported yet", where, i);
    out.push_back(std::move(c));
  }
  return out;
}

namespace {
struct Builder {
  const Tokenizer& tok;
  EncodedSample s;
  void token(int32_t id, bool train) {
    s.ids.push_back(id);
    s.target.push_back(train);
  }
  void text(const std::string& t, bool train) {
    tok.encode_append(t, s.ids, /*allow_special=*/false);
    s.target.resize(s.ids.size(), train);
  }
};

bool is_user_like(const std::string& r) { return r == "user" || r == "developer" || r == "tool"; }

// Renders the messages; `open_assistant` adds the generation prompt at the end.
EncodedSample render(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool thinking,
                     bool open_assistant) {
  const ChatTokens ct = ChatTokens::from(tok);
  Builder b{tok, {}};
  b.token(ct.bos, false);
  int64_t last_user = -1;
  for (size_t i = 0; i < msgs.size(); ++i)
    if (is_user_like(msgs[i].role)) last_user = int64_t(i);
  bool in_user_turn = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if (m.role == "system") {
      b.text(m.content, false);
      in_user_turn = false;
    } else if (is_user_like(m.role)) {
      if (!in_user_turn) b.token(ct.user, false);
      b.text(m.role == "tool" ? "<tool_result>" + m.content + "</tool_result>" : m.content, false);
      in_user_turn = true;
    } else {  // assistant
      b.token(ct.assistant, false);
      const bool keep_reasoning = thinking && int64_t(i) > last_user;
      if (keep_reasoning) {
        b.token(ct.think, false);
        b.text(m.reasoning, true);
        b.token(ct.end_think, true);
      } else {
        b.token(ct.end_think, false);
      }
      b.text(m.content, true);
      b.token(ct.eos, true);
      in_user_turn = false;
    }
  }
  if (open_assistant) {
    b.token(ct.assistant, false);
    b.token(thinking ? ct.think : ct.end_think, false);
  }
  return std::move(b.s);
}
}  // namespace

EncodedSample encode_chat(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, ThinkingMode mode) {
  int64_t last_assistant = -1;
  for (size_t i = 0; i < msgs.size(); ++i)
    if (msgs[i].role == "assistant") last_assistant = int64_t(i);
  TREX_CHECK(last_assistant >= 0, "conversation has no assistant turn to train on");
  bool thinking = mode == ThinkingMode::On ||
                  (mode == ThinkingMode::Auto && !msgs[size_t(last_assistant)].reasoning.empty());
  return render(tok, msgs, thinking, false);
}

EncodedSample encode_text(const Tokenizer& tok, std::string_view text) {
  const ChatTokens ct = ChatTokens::from(tok);
  EncodedSample s;
  s.ids.push_back(ct.bos);
  tok.encode_append(text, s.ids, false);
  s.ids.push_back(ct.eos);
  s.target.assign(s.ids.size(), 1);
  s.target[0] = 0;
  return s;
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool thinking) {
  TREX_CHECK(!msgs.empty() && is_user_like(msgs.back().role), "a generation prompt must end with a user turn");
  return render(tok, msgs, thinking, true).ids;
}

}  // namespace trex::data
