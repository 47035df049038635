#include "orkit/eval/protocol.h"

#include <cctype>
#include <regex>

#include "core/error.h"
#include "orkit/eval/extract.h"

namespace trex::orkit::eval {

const char* protocol_name(Protocol p) { return p == Protocol::Report ? "report" : "trex"; }

Protocol parse_protocol(const std::string& name) {
  if (name == "trex") return Protocol::Trex;
  if (name == "report") return Protocol::Report;
  fail("unknown protocol \"{}\"; expected trex (T-Rex's corrected protocol) or report (the founding report's)",
       name);
}

namespace {

// A Python string literal holding `s` exactly (triple quotes cannot hold every text; escapes can).
std::string py_literal(const std::string& s) {
  std::string o = "'";
  for (unsigned char c : s) {
    if (c == '\\' || c == '\'')
      o += '\\', o += char(c);
    else if (c == '\n')
      o += "\\n";
    else if (c == '\r')
      o += "\\r";
    else if (c == '\t')
      o += "\\t";
    else if (c < 0x20 || c == 0x7f)
      o += fmt::format("\\x{:02x}", c);
    else
      o += char(c);
  }
  return o + "'";
}

std::string add_imports(std::string code, bool orgeval) {
  if (code.find("import json") == std::string::npos) code = "import json\n" + code;
  if (code.find("import gurobipy") == std::string::npos) code = "import gurobipy as gp\n" + code;
  if (orgeval) code = "from gurobipy import GRB\n" + code;
  return code;
}

std::string file_name_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string safe_name(const std::string& s) {
  std::string o;
  for (char c : s) o += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
  return o;
}

// The wrapper: runs the (already rewritten) code at module level, as the report's runner does; any
// exception, SystemExit included, ends the run with status 3 before the look-alikes' own fall-backs run.
std::string wrap(const std::string& code, const std::string& setup, const std::string& after) {
  return "import os as _trex_os, sys as _trex_sys, traceback as _trex_tb\n" + setup +
         "_trex_code = " + py_literal(code) +
         "\ntry:\n"
         "    exec(compile(_trex_code, 'answer.py', 'exec'), globals())\n"
         "except BaseException:\n"
         "    _trex_tb.print_exc()\n"
         "    _trex_sys.stderr.flush()\n"
         "    _trex_os._exit(3)\n" +
         after;
}

}  // namespace

std::string report_orgeval_rewrites(const std::string& code, const std::string& lp_path,
                                    const std::string& data_path) {
  std::string s = code;
  // data.json -> the data file's path relative to the harness's working directory
  for (size_t at = s.find("data.json"); at != std::string::npos; at = s.find("data.json", at + data_path.size()))
    s.replace(at, 9, data_path);
  // model.write(...) / m.write(...): no word boundary, the argument has no ')'
  static const std::regex write_call(R"((model|m)\.write\([^)]*\))");
  const bool has_write = std::regex_search(s, write_call);
  if (has_write) {
    s = std::regex_replace(s, write_call, "$1.write(" + py_literal(lp_path) + ")");
  } else {
    static const std::regex uses_m(R"(m\.addVars?\()");
    const bool m_style = std::regex_search(s, uses_m) && s.find("model.addVar") == std::string::npos;
    s += std::string(s.empty() || s.back() == '\n' ? "" : "\n") + (m_style ? "m" : "model") + ".write(" +
         py_literal(lp_path) + ")\n";
  }
  // one-line model.addVars(...) without lb= -> free variables (the quirk that changes verdicts)
  static const std::regex add_vars(R"(model\.addVars\(([^)\n]*)\)\n)");
  std::string out;
  auto begin = std::sregex_iterator(s.begin(), s.end(), add_vars);
  size_t last = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    out += s.substr(last, size_t(m.position()) - last);
    const std::string args = m[1].str();
    if (args.find("lb=") == std::string::npos)
      out += "model.addVars(" + args + ", lb=-GRB.INFINITY)\n";
    else
      out += m.str();
    last = size_t(m.position() + m.length());
  }
  out += s.substr(last);
  return out;
}

std::string report_program(const BenchItem& item, const std::string& response) {
  if (item.grade == GradeKind::LpStructure) {
    const ExtractedCode x = extract_code_report_orgeval(response);
    const std::string data_name =
        item.data_path.empty() ? "data_" + safe_name(item.id) + ".json" : file_name_of(item.data_path);
    const std::string data_rel = "lp_data/" + data_name;
    const std::string lp_rel = "temp_lp/" + safe_name(item.id) + "_model.lp";
    const std::string code = add_imports(report_orgeval_rewrites(x.code, lp_rel, data_rel), true);
    // The harness's directories: the data file under its relative name, the LP output directory.
    const std::string setup =
        "_trex_os.makedirs('lp_data', exist_ok=True)\n_trex_os.makedirs('temp_lp', exist_ok=True)\n"
        "if _trex_os.path.exists('data.json'):\n"
        "    with open('data.json', 'rb') as _s, open(" + py_literal(data_rel) + ", 'wb') as _d:\n"
        "        _d.write(_s.read())\n";
    return wrap(code, setup, "");
  }
  const ExtractedCode x = extract_code_report_solver(response);
  // data.json -> the absolute path of the data file, substituted when the program starts (the work
  // directory's absolute path is only known then).
  const std::string setup =
      "_trex_abs = _trex_os.path.join(_trex_os.getcwd(), 'data.json')\n";
  const std::string after =
      "_trex_g = globals()\n"
      "_trex_found = [n for n in ('model', 'm') if hasattr(_trex_g.get(n), 'optimize')]\n"
      "if not _trex_found:\n"
      "    _trex_sys.stderr.write('MODEL_NOT_FOUND: no global `model` or `m` with optimize()\\n')\n"
      "    _trex_os._exit(4)\n"
      "model = _trex_g[_trex_found[0]]\n";
  std::string code = add_imports(x.code, false);
  // The replacement happens in Python: `_trex_code.replace('data.json', _trex_abs)`.
  std::string w = wrap(code, setup, after);
  const std::string marker = "_trex_code = " + py_literal(code) + "\n";
  const size_t at = w.find(marker);
  TREX_ASSERT(at != std::string::npos);
  w.insert(at + marker.size(), "_trex_code = _trex_code.replace('data.json', _trex_abs)\n");
  return w;
}

std::map<std::string, std::string> apply_protocol(Protocol protocol, const Benchmark& bench,
                                                  const std::map<std::string, std::string>& responses) {
  if (protocol == Protocol::Trex) return responses;
  std::map<std::string, std::string> out;
  for (const auto& item : bench.items) {
    auto it = responses.find(item.id);
    if (it == responses.end()) continue;
    out[item.id] = "```python\n" + report_program(item, it->second) + "```\n";
  }
  return out;
}

}  // namespace trex::orkit::eval
