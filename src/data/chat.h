// DeepSeek-V4's conversation encoding (design §6) for SFT: token ids plus a loss mask that trains on the
// assistant's tokens only (reasoning, </think>, content, EOS). Layout:
//   BOS [system content] <｜User｜> user content <｜Assistant｜> (<think> | </think>) ... EOS <｜User｜> ...
// Thinking mode: the last assistant turns (after the last user message) are rendered <think> reasoning
// </think> content EOS, with <think> part of the prompt; earlier assistant turns drop their reasoning and
// are rendered </think> content EOS with </think> part of the prompt (the chat-mode form). Tool results
// (role "tool") are merged into the user turn as <tool_result>...</tool_result>. Content text is encoded
// with special tokens disabled so data cannot inject role markers.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/tokenizer.h"

namespace trex::data {

struct ChatMessage {
  std::string role;       // system | user | developer | tool | assistant
  std::string content;
  std::string reasoning;  // assistant only ("reasoning_content" or "reasoning" in JSON)
};

enum class ThinkingMode { Auto, On, Off };  // Auto: on when the last assistant turn carries reasoning

struct EncodedSample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> target;  // 1: ids[i] is a training target (predicted from ids[0..i-1])
};

struct ChatTokens {
  int32_t bos, eos, user, assistant, think, end_think;
  static ChatTokens from(const Tokenizer& t);  // throws naming the missing token
};

// Parses {"messages": [...]}'s array; errors start with `where` (e.g. "file.jsonl:12").
std::vector<ChatMessage> parse_messages(const nlohmann::json& messages, const std::string& where);

EncodedSample encode_chat(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, ThinkingMode mode);
// CPT document: BOS text EOS, every token after BOS is a target.
EncodedSample encode_text(const Tokenizer& tok, std::string_view text);
// Generation prompt: the conversation (ending in a user turn) followed by <｜Assistant｜> and <think> or
// </think>.
std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool thinking);

}  // namespace trex::data
