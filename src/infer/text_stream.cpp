#include "infer/text_stream.h"

#include <algorithm>

namespace trex::infer {

size_t utf8_complete_prefix(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(4, n); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t len = 1;
    if ((c & 0xE0) == 0xC0)
      len = 2;
    else if ((c & 0xF0) == 0xE0)
      len = 3;
    else if ((c & 0xF8) == 0xF0)
      len = 4;
    return len > back ? n - back : n;  // an unfinished sequence starts at n - back
  }
  return n;
}

TextStream::TextStream(Decode decode, std::vector<std::string> stop, int32_t end_think)
    : decode_(std::move(decode)), end_think_(end_think), in_reasoning_(end_think >= 0) {
  for (auto& s : stop)
    if (!s.empty()) stop_.push_back(std::move(s));
  for (const auto& s : stop_) hold_ = std::max(hold_, s.size() - 1);
}

TextDelta TextStream::push(const std::vector<int32_t>& tokens) {
  if (stopped_) return {};
  for (int32_t t : tokens) {
    if (in_reasoning_) {
      if (t == end_think_)
        in_reasoning_ = false;
      else
        reasoning_ids_.push_back(t);
    } else {
      content_ids_.push_back(t);
    }
  }
  return emit(false);
}

TextDelta TextStream::finish() {
  return emit(true);
}

TextDelta TextStream::emit(bool final) {
  TextDelta d;
  if (!reasoning_ids_.empty()) {
    reasoning_text_ = decode_(reasoning_ids_);
    const size_t ready = final ? reasoning_text_.size() : utf8_complete_prefix(reasoning_text_);
    if (ready > reasoning_sent_) {
      d.reasoning = reasoning_text_.substr(reasoning_sent_, ready - reasoning_sent_);
      reasoning_sent_ = ready;
    }
  }
  if (!stopped_ && !content_ids_.empty()) {
    content_text_ = decode_(content_ids_);
    // The earliest stop match anywhere in the content (a match may span the last delta).
    size_t cut = std::string::npos;
    for (const auto& s : stop_) cut = std::min(cut, content_text_.find(s));
    if (cut != std::string::npos) {
      content_text_.resize(cut);
      stopped_ = true;
    }
  }
  size_t ready = content_text_.size();
  if (!final && !stopped_) {
    ready = utf8_complete_prefix(content_text_);
    ready = ready > hold_ ? ready - hold_ : 0;
    ready = utf8_complete_prefix(content_text_.substr(0, ready));
  }
  if (ready > content_sent_) {
    d.content = content_text_.substr(content_sent_, ready - content_sent_);
    content_sent_ = ready;
  }
  return d;
}

}  // namespace trex::infer
