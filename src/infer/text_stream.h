// Turns a growing list of generated token ids into text deltas for streaming: never splits a UTF-8
// character, splits reasoning (before </think>) from content in thinking mode, and applies OpenAI "stop"
// strings (the text is cut before the first match; text that could still become a match is held back).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace trex::infer {

struct TextDelta {
  std::string reasoning, content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

class TextStream {
 public:
  using Decode = std::function<std::string(const std::vector<int32_t>&)>;
  // end_think >= 0: tokens before it are reasoning (the token itself is not shown); -1: all content.
  TextStream(Decode decode, std::vector<std::string> stop, int32_t end_think);
  TextDelta push(const std::vector<int32_t>& tokens);
  TextDelta finish();  // everything still held back (after a stop match: nothing beyond it)
  bool stopped() const { return stopped_; }  // a stop string matched; the request should end
  const std::string& reasoning() const { return reasoning_text_; }
  const std::string& content() const { return content_text_; }

 private:
  TextDelta emit(bool final);
  Decode decode_;
  std::vector<std::string> stop_;
  size_t hold_ = 0;  // longest stop string - 1
  int32_t end_think_;
  bool in_reasoning_;
  std::vector<int32_t> reasoning_ids_, content_ids_;
  std::string reasoning_text_, content_text_;  // decoded so far (content cut at a stop match)
  size_t reasoning_sent_ = 0, content_sent_ = 0;
  bool stopped_ = false;
};

// Length of the longest prefix of s that does not end inside a UTF-8 sequence.
size_t utf8_complete_prefix(const std::string& s);

}  // namespace trex::infer
