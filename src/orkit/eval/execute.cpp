#include "orkit/eval/execute.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"

namespace trex::orkit::eval {

namespace fs = std::filesystem;
using nlohmann::json;

const char* exec_status_name(ExecStatus s) {
  switch (s) {
    case ExecStatus::Optimal:
      return "optimal";
    case ExecStatus::Infeasible:
      return "infeasible";
    case ExecStatus::Unbounded:
      return "unbounded";
    case ExecStatus::InfeasibleOrUnbounded:
      return "infeasible_or_unbounded";
    case ExecStatus::SolverError:
      return "solver_error";
    case ExecStatus::ProgramError:
      return "program_error";
    case ExecStatus::NoModel:
      return "no_model";
    case ExecStatus::Timeout:
      return "timeout";
    case ExecStatus::Crashed:
      return "crashed";
    case ExecStatus::LpWritten:
      return "lp_written";
  }
  return "?";
}

fs::path default_python_pkg() {
  if (const char* p = std::getenv("TREX_PYTHON_PKG")) return p;
  return source_dir() / "python" / "trex_solvers";
}

std::string find_python(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    size_t pos = 0;
    while (pos <= p.size()) {
      size_t end = p.find(':', pos);
      if (end == std::string::npos) end = p.size();
      fs::path cand = fs::path(p.substr(pos, end - pos)) / "python3";
      if (access(cand.c_str(), X_OK) == 0) return cand.string();
      pos = end + 1;
    }
  }
  fail("no Python interpreter found (/usr/bin/python3 or python3 on PATH); set --python");
}

namespace {

struct TempDir {
  fs::path path;
  bool keep = false;
  explicit TempDir(const fs::path& root, bool keep_) : keep(keep_) {
    fs::path base = root.empty() ? fs::path(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") : root;
    fs::create_directories(base);
    std::string tmpl = (base / "trex-eval-XXXXXX").string();
    TREX_CHECK(mkdtemp(tmpl.data()) != nullptr, "cannot create a temporary directory under {}",
               base.string());
    path = tmpl;
    fs::permissions(path, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
  }
  ~TempDir() {
    if (keep) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_plain(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  TREX_CHECK(out.good(), "cannot write {}", p.string());
}

std::vector<std::string> base_env(const ExecConfig& cfg, const fs::path& dir) {
  return {"PATH=/usr/local/bin:/usr/bin:/bin",
          "HOME=" + dir.string(),
          "TMPDIR=" + dir.string(),
          "LANG=C.UTF-8",
          "PYTHONPATH=" + cfg.python_pkg.string(),
          "PYTHONDONTWRITEBYTECODE=1",
          "PYTHONHASHSEED=0",
          "PYTHONUNBUFFERED=1",
          "TREX_BIN=" + fs::absolute(cfg.trex_bin).string(),
          "OMP_NUM_THREADS=1",
          "OPENBLAS_NUM_THREADS=1",
          "MALLOC_ARENA_MAX=2"};
}

// Maps a sandbox end that is not a normal exit to an outcome; true when it did.
bool abnormal_end(const SandboxResult& r, ExecOutcome& out) {
  switch (r.end) {
    case SandboxEnd::WallTimeout:
    case SandboxEnd::CpuTimeout:
      out.status = ExecStatus::Timeout;
      break;
    case SandboxEnd::OutputLimit:
    case SandboxEnd::Signaled:
      out.status = ExecStatus::Crashed;
      break;
    case SandboxEnd::StartFailed:
      out.status = ExecStatus::ProgramError;
      break;
    case SandboxEnd::Exited:
      return false;
  }
  out.message = r.describe();
  return true;
}

std::string tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(s.size() - n);
}

void apply_solver_json(const json& j, ExecOutcome& out) {
  const std::string st = j.value("status", "error");
  if (st == "optimal") {
    out.status = ExecStatus::Optimal;
    if (j.contains("objective") && j["objective"].is_number()) out.objective = j["objective"].get<double>();
    if (j.contains("values") && j["values"].is_object())
      for (const auto& [k, v] : j["values"].items())
        if (v.is_number()) out.values[k] = v.get<double>();
    if (!out.objective)
      out.status = ExecStatus::SolverError, out.message = "optimal without an objective value";
  } else if (st == "infeasible") {
    out.status = ExecStatus::Infeasible;
  } else if (st == "unbounded") {
    out.status = ExecStatus::Unbounded;
  } else if (st == "infeasible_or_unbounded") {
    out.status = ExecStatus::InfeasibleOrUnbounded;
  } else if (st == "error" && j.value("solver", std::string()) == "") {
    out.status = ExecStatus::ProgramError;  // no solver ran: the model file did not parse
  } else {
    out.status = ExecStatus::SolverError;
  }
  if (out.message.empty()) out.message = j.value("message", "");
}

ExecOutcome run_python(const BenchItem& item, const ExtractedCode& code, GradeKind grade,
                       const ExecConfig& cfg, const TempDir& dir, int slot) {
  ExecOutcome out;
  write_plain(dir.path / "answer.py", code.code);
  json data = item.data.is_null() ? json{{"question", item.question}} : item.data;
  write_plain(dir.path / "data.json", data.dump());
  const fs::path result = dir.path / ".trex_result.json";
  std::vector<std::string> argv{find_python(cfg.python),
                                "-B",
                                "-s",
                                (cfg.python_pkg / "_trex_run.py").string(),
                                "answer.py",
                                result.string(),
                                grade == GradeKind::LpStructure ? "lp" : "objective"};
  SandboxLimits lim = cfg.limits;
  lim.slot = slot;
  SandboxResult r = run_sandboxed(argv, base_env(cfg, dir.path), dir.path, lim);
  out.seconds = r.seconds;
  if (abnormal_end(r, out)) return out;
  json j;
  try {
    j = json::parse(read_text_file(result));
  } catch (const std::exception&) {
    out.status = ExecStatus::ProgramError;
    out.message = fmt::format("no verdict from the runner ({}): {}", r.describe(), tail(r.output, 2000));
    return out;
  }
  const std::string st = j.value("status", "error");
  if (st == "exception") {
    out.status = ExecStatus::ProgramError;
    out.message =
        j.value("error_type", "Error") + ": " + j.value("message", "") + "\n" + j.value("traceback", "");
    return out;
  }
  if (st == "no_model") {
    out.status = ExecStatus::NoModel;
    out.message = j.value("message", "");
    return out;
  }
  if (st == "lp_written") {
    const auto files = j.value("lp_files", std::vector<std::string>{});
    TREX_ASSERT(!files.empty());
    fs::path lp = files.back();
    std::error_code ec;
    if (fs::file_size(lp, ec) > (size_t(64) << 20)) {
      out.status = ExecStatus::ProgramError;
      out.message = "the LP file is larger than 64 MiB";
      return out;
    }
    out.lp_text = read_text_file(lp);
    out.status = ExecStatus::LpWritten;
    out.message = "LP file " + lp.filename().string();
    return out;
  }
  apply_solver_json(j, out);
  return out;
}

ExecOutcome run_solver_file(const ExtractedCode& code, const ExecConfig& cfg, const TempDir& dir, int slot) {
  ExecOutcome out;
  const char* ext = code.format == CodeFormat::Lp    ? "answer.lp"
                    : code.format == CodeFormat::Mps ? "answer.mps"
                                                     : "answer.mod";
  write_plain(dir.path / ext, code.code);
  std::vector<std::string> argv{fs::absolute(cfg.trex_bin).string(), "solve", ext, "--json"};
  SandboxLimits lim = cfg.limits;
  lim.slot = slot;
  SandboxResult r = run_sandboxed(argv, base_env(cfg, dir.path), dir.path, lim);
  out.seconds = r.seconds;
  if (abnormal_end(r, out)) return out;
  const std::string& s = r.output;
  size_t start = s.rfind("{\"status\"");
  if (start == std::string::npos) start = s.find('{');
  json j;
  try {
    if (start == std::string::npos) throw std::runtime_error("no JSON");
    j = json::parse(s.substr(start));
  } catch (const std::exception&) {
    out.status = ExecStatus::ProgramError;  // the file did not parse: the answer's fault
    out.message = fmt::format("trex solve: {}: {}", r.describe(), tail(s, 2000));
    return out;
  }
  apply_solver_json(j, out);
  if (out.status == ExecStatus::SolverError && r.exit_code != 0 && out.message.empty())
    out.message = tail(s, 2000);
  return out;
}

}  // namespace

ExecOutcome execute_answer(const BenchItem& item, const ExtractedCode& code, GradeKind grade,
                           const ExecConfig& config, int slot) {
  ExecConfig cfg = config;
  if (cfg.python_pkg.empty()) cfg.python_pkg = default_python_pkg();
  cfg.python_pkg = fs::absolute(cfg.python_pkg);
  if (grade == GradeKind::LpStructure && code.format == CodeFormat::Lp) {
    ExecOutcome out;  // the answer is the LP file itself
    out.status = ExecStatus::LpWritten;
    out.lp_text = code.code;
    out.message = "LP answer";
    return out;
  }
  TempDir dir(cfg.work_root, cfg.keep_workdirs);
  switch (code.format) {
    case CodeFormat::Python:
      return run_python(item, code, grade, cfg, dir, slot);
    case CodeFormat::Lp:
    case CodeFormat::Mps:
    case CodeFormat::MathProg: {
      if (grade == GradeKind::LpStructure) {
        ExecOutcome out;
        out.status = ExecStatus::NoModel;
        out.message = std::string("LP-structure grading needs an LP file or a program writing one, got ") +
                      format_name(code.format);
        return out;
      }
      return run_solver_file(code, cfg, dir, slot);
    }
    case CodeFormat::None:
      break;
  }
  ExecOutcome out;
  out.status = ExecStatus::NoModel;
  out.message = "no code";
  return out;
}

}  // namespace trex::orkit::eval
