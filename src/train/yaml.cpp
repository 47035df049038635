#include "train/yaml.h"

#include <cctype>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/files.h"

namespace trex::train {

using json = nlohmann::json;

namespace {

struct Line {
  int number;
  int indent;
  std::string text;  // without indentation and comment, right-trimmed
};

class YamlParser {
 public:
  YamlParser(std::string_view text, std::string file) : file_(std::move(file)) { split_lines(text); }

  json parse() {
    if (lines_.empty()) return json::object();
    json v = block(lines_[0].indent);
    if (pos_ < lines_.size()) error(lines_[pos_].number, "unexpected indentation");
    return v;
  }

 private:
  [[noreturn]] void error(int line, const std::string& what) const { fail("{}:{}: {}", file_, line, what); }

  void split_lines(std::string_view text) {
    int number = 0;
    size_t start = 0;
    while (start <= text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string_view::npos) end = text.size();
      std::string raw(text.substr(start, end - start));
      ++number;
      start = end + 1;
      if (!raw.empty() && raw.back() == '\r') raw.pop_back();
      size_t ind = 0;
      while (ind < raw.size() && raw[ind] == ' ') ++ind;
      if (ind < raw.size() && raw[ind] == '\t') error(number, "tab in indentation (use spaces)");
      std::string body = strip_comment(raw.substr(ind), number);
      while (!body.empty() && (body.back() == ' ' || body.back() == '\t')) body.pop_back();
      if (body.empty()) continue;
      if (body == "---" || body == "...") {
        if (!lines_.empty()) error(number, "multiple documents are not supported");
        continue;
      }
      lines_.push_back({number, int(ind), body});
      if (end == text.size()) break;
    }
  }

  std::string strip_comment(const std::string& s, int line) const {
    char quote = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      char c = s[i];
      if (quote) {
        if (c == '\\' && quote == '"') ++i;
        else if (c == quote) quote = 0;
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
        return s.substr(0, i);
      }
    }
    (void)line;
    return s;
  }

  // A block at exactly `indent`: a list if it starts with "- ", else a mapping.
  json block(int indent) {
    const Line& first = lines_[pos_];
    if (first.indent != indent) error(first.number, "bad indentation");
    if (is_list_item(first.text)) return list_block(indent);
    return map_block(indent);
  }

  static bool is_list_item(const std::string& t) { return t == "-" || t.rfind("- ", 0) == 0; }

  json list_block(int indent) {
    json arr = json::array();
    while (pos_ < lines_.size() && lines_[pos_].indent == indent && is_list_item(lines_[pos_].text)) {
      Line& l = lines_[pos_];
      std::string rest = l.text == "-" ? "" : l.text.substr(2);
      size_t lead = rest.find_first_not_of(' ');
      if (rest.empty() || lead == std::string::npos) {
        ++pos_;
        if (pos_ < lines_.size() && lines_[pos_].indent > indent) arr.push_back(block(lines_[pos_].indent));
        else arr.push_back(nullptr);
        continue;
      }
      const int item_indent = indent + 2 + int(lead);
      rest = rest.substr(lead);
      if (find_key_colon(rest) != std::string::npos && rest[0] != '[' && rest[0] != '{' && rest[0] != '"' &&
          rest[0] != '\'') {
        // "- key: value" starts a mapping whose other keys sit at item_indent.
        l.indent = item_indent;
        l.text = rest;
        arr.push_back(map_block(item_indent));
      } else {
        arr.push_back(scalar_or_flow(rest, l.number));
        ++pos_;
      }
    }
    if (pos_ < lines_.size() && lines_[pos_].indent > indent) error(lines_[pos_].number, "bad indentation in list");
    return arr;
  }

  // Position of the ':' that ends a mapping key (followed by space or end), outside quotes.
  static size_t find_key_colon(const std::string& t) {
    char quote = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      char c = t[i];
      if (quote) {
        if (c == '\\' && quote == '"') ++i;
        else if (c == quote) quote = 0;
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == ':' && (i + 1 == t.size() || t[i + 1] == ' ')) {
        return i;
      } else if ((c == '[' || c == '{') && i == 0) {
        return std::string::npos;
      }
    }
    return std::string::npos;
  }

  json map_block(int indent) {
    json obj = json::object();
    while (pos_ < lines_.size() && lines_[pos_].indent == indent) {
      const Line& l = lines_[pos_];
      if (is_list_item(l.text)) error(l.number, "list item where a mapping key was expected");
      size_t colon = find_key_colon(l.text);
      if (colon == std::string::npos) error(l.number, "expected 'key: value'");
      std::string key = l.text.substr(0, colon);
      while (!key.empty() && key.back() == ' ') key.pop_back();
      if (!key.empty() && (key[0] == '"' || key[0] == '\'')) key = quoted(key, l.number).get<std::string>();
      if (key.empty()) error(l.number, "empty key");
      if (key[0] == '&' || key[0] == '*' || key[0] == '!') error(l.number, "anchors, aliases and tags are not supported");
      if (obj.contains(key)) error(l.number, "duplicate key '" + key + "'");
      std::string rest = l.text.substr(colon + 1);
      size_t lead = rest.find_first_not_of(' ');
      const int number = l.number;
      ++pos_;
      if (lead == std::string::npos) {
        if (pos_ < lines_.size() && lines_[pos_].indent > indent) obj[key] = block(lines_[pos_].indent);
        else if (pos_ < lines_.size() && lines_[pos_].indent == indent && is_list_item(lines_[pos_].text))
          obj[key] = list_block(indent);  // "key:\n- a\n- b" (list at the key's indent)
        else obj[key] = nullptr;
      } else {
        obj[key] = scalar_or_flow(rest.substr(lead), number);
        if (pos_ < lines_.size() && lines_[pos_].indent > indent)
          error(lines_[pos_].number, "unexpected indented block after a value (multi-line scalars are not supported)");
      }
    }
    if (pos_ < lines_.size() && lines_[pos_].indent > indent) error(lines_[pos_].number, "bad indentation");
    return obj;
  }

  json quoted(const std::string& s, int line) const {
    if (s[0] == '"') {
      try {
        return json::parse(s);  // JSON string escapes are a superset of what configs need
      } catch (const json::exception&) {
        error(line, "bad double-quoted string " + s);
      }
    }
    if (s.size() < 2 || s.back() != '\'') error(line, "unterminated single-quoted string");
    std::string out;
    for (size_t i = 1; i + 1 < s.size(); ++i) {
      if (s[i] == '\'' && s[i + 1] == '\'') ++i;
      out.push_back(s[i]);
    }
    return out;
  }

  json plain_scalar(const std::string& s, int line) const {
    if (s == "null" || s == "~" || s == "Null" || s == "NULL") return nullptr;
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    if (s[0] == '&' || s[0] == '*' || s[0] == '!') error(line, "anchors, aliases and tags are not supported");
    if (s[0] == '|' || s[0] == '>') error(line, "multi-line scalars are not supported");
    // Numbers: integers and floats (1e-3, .5, -2.0); anything else is a string.
    const char* b = s.c_str();
    char* e = nullptr;
    long long iv = std::strtoll(b, &e, 10);
    if (*e == '\0' && e != b) return iv;
    double dv = std::strtod(b, &e);
    if (*e == '\0' && e != b && s.find_first_of("0123456789") != std::string::npos && s != "." ) {
      if (s.find_first_not_of("0123456789+-.eE") == std::string::npos) return dv;
    }
    return s;
  }

  json scalar_or_flow(const std::string& s, int line) const {
    if (s[0] == '[' || s[0] == '{') {
      size_t i = 0;
      json v = flow(s, i, line);
      while (i < s.size() && s[i] == ' ') ++i;
      if (i != s.size()) error(line, "trailing text after flow collection");
      return v;
    }
    if (s[0] == '"' || s[0] == '\'') return quoted(s, line);
    return plain_scalar(s, line);
  }

  json flow(const std::string& s, size_t& i, int line) const {
    auto skip = [&] {
      while (i < s.size() && s[i] == ' ') ++i;
    };
    skip();
    if (i >= s.size()) error(line, "unterminated flow collection");
    if (s[i] == '[' || s[i] == '{') {
      const char open = s[i], close = open == '[' ? ']' : '}';
      json out = open == '[' ? json::array() : json::object();
      ++i;
      skip();
      if (i < s.size() && s[i] == close) {
        ++i;
        return out;
      }
      while (true) {
        if (open == '[') {
          out.push_back(flow(s, i, line));
        } else {
          json k = flow_atom(s, i, line, true);
          skip();
          if (i >= s.size() || s[i] != ':') error(line, "expected ':' in flow mapping");
          ++i;
          const std::string key = k.is_string() ? k.get<std::string>() : k.dump();
          if (out.contains(key)) error(line, "duplicate key '" + key + "'");
          out[key] = flow(s, i, line);
        }
        skip();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        if (i < s.size() && s[i] == close) {
          ++i;
          return out;
        }
        error(line, std::string("expected ',' or '") + close + "' in flow collection");
      }
    }
    return flow_atom(s, i, line, false);
  }

  json flow_atom(const std::string& s, size_t& i, int line, bool key) const {
    while (i < s.size() && s[i] == ' ') ++i;
    if (i < s.size() && (s[i] == '"' || s[i] == '\'')) {
      const char q = s[i];
      size_t j = i + 1;
      while (j < s.size() && s[j] != q) j += (s[j] == '\\' && q == '"') ? 2 : 1;
      if (j >= s.size()) error(line, "unterminated string in flow collection");
      json v = quoted(s.substr(i, j + 1 - i), line);
      i = j + 1;
      return v;
    }
    size_t j = i;
    while (j < s.size() && s[j] != ',' && s[j] != ']' && s[j] != '}' && !(key && s[j] == ':')) ++j;
    std::string tok = s.substr(i, j - i);
    while (!tok.empty() && tok.back() == ' ') tok.pop_back();
    if (tok.empty()) error(line, "empty value in flow collection");
    i = j;
    return key ? json(tok) : plain_scalar(tok, line);
  }

  std::string file_;
  std::vector<Line> lines_;
  size_t pos_ = 0;
};

}  // namespace

json parse_yaml(std::string_view text, const std::string& filename) { return YamlParser(text, filename).parse(); }

json read_config_file(const std::filesystem::path& path) {
  if (path.extension() == ".json") return read_json_file(path);
  return parse_yaml(read_text_file(path), path.string());
}

}  // namespace trex::train
