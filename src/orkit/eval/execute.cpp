#include "orkit/eval/execute.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
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

// Fixed names the runner (_trex_run.py) writes inside the work directory; the harness reads nothing else.
constexpr const char* kModelFile = ".trex_model.lp";
constexpr const char* kAnswerLpFile = ".trex_answer.lp";
constexpr int kExitProgramError = 3, kExitNoModel = 4;  // _trex_run.py's exit statuses
constexpr size_t kMaxModelBytes = size_t(64) << 20;
constexpr size_t kMaxVerdictOutputBytes = size_t(64) << 20;
// Where the project's files appear inside the jail.
constexpr const char* kJailPythonPkg = "/trex/python";
constexpr const char* kJailTrexBin = "/trex/bin/trex";

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
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    if (keep) return;
    std::error_code ec;
    if (fs::remove_all(path, ec) != static_cast<std::uintmax_t>(-1) && !ec) return;
    // The program may have left directories without write permission: give them back, then retry.
    for (auto it = fs::recursive_directory_iterator(path, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      if (it->is_directory(ec) && !it->is_symlink(ec)) fs::permissions(it->path(), fs::perms::owner_all, ec);
    fs::remove_all(path, ec);
  }
};

void write_plain(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  TREX_CHECK(out.good(), "cannot write {}", p.string());
}

// What a job needs: the interpreter (under /usr), the look-alikes and the trex binary; paths as seen inside.
struct JobPaths {
  std::string python_pkg, trex_bin, home, tmp;
  std::vector<JailView> views;
};

// True when a user with no relation to the owner can reach `p`: every directory above it searchable by others and
// `p` itself readable (and, for a directory, searchable) by others.
bool reachable_by_others(const fs::path& p) {
  struct stat st {};
  if (stat(p.c_str(), &st) != 0 || !(st.st_mode & S_IROTH)) return false;
  if (S_ISDIR(st.st_mode) && !(st.st_mode & S_IXOTH)) return false;
  for (fs::path d = p.parent_path(); !d.empty(); d = d.parent_path()) {
    if (stat(d.c_str(), &st) != 0 || !(st.st_mode & S_IXOTH)) return false;
    if (d == d.root_path()) break;
  }
  return true;
}

// A root harness runs each jail under a slot uid, and bwrap (started as that uid) cannot bind a file below a
// directory closed to other users (a checkout under /root, say). Such a view is copied once per process into a
// root-owned, world-readable staging directory, removed when the process ends.
class ViewStage {
 public:
  fs::path reachable(const fs::path& src) {
    if (geteuid() != 0 || reachable_by_others(src)) return src;
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = copies_.find(src); it != copies_.end()) return it->second;
    if (dir_.empty()) {
      std::string t = (fs::temp_directory_path() / "trex-jail-views-XXXXXX").string();
      TREX_CHECK(mkdtemp(t.data()) != nullptr, "sandbox: cannot make a staging directory in {}: {}",
                 fs::temp_directory_path().string(), strerror(errno));
      dir_ = t;
      fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                fs::perms::others_read | fs::perms::others_exec);
    }
    const fs::path dst = dir_ / std::to_string(copies_.size()) / src.filename();
    fs::create_directories(dst.parent_path());
    fs::copy(src, dst, fs::copy_options::recursive);
    const auto rx = fs::perms::others_read | fs::perms::others_exec | fs::perms::group_read | fs::perms::group_exec;
    for (fs::path d = dst.parent_path(); d != dir_; d = d.parent_path()) fs::permissions(d, rx, fs::perm_options::add);
    fs::permissions(dst, rx, fs::perm_options::add);
    if (fs::is_directory(dst))
      for (const auto& e : fs::recursive_directory_iterator(dst))
        fs::permissions(e.path(), e.is_directory() ? rx : fs::perms::others_read | fs::perms::group_read,
                        fs::perm_options::add);
    copies_[src] = dst;
    return dst;
  }
  ~ViewStage() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

 private:
  std::mutex mu_;
  fs::path dir_;
  std::map<fs::path, fs::path> copies_;
};

fs::path reachable_view(const fs::path& src) {
  static ViewStage stage;
  return stage.reachable(src);
}

// `with_python`: the look-alikes are visible (a program's jail); the verdict's jail sees only trex.
JobPaths job_paths(const ExecConfig& cfg, const fs::path& dir, bool with_python) {
  JobPaths p;
  if (cfg.isolation == Isolation::None) {
    p.python_pkg = cfg.python_pkg.string();
    p.trex_bin = fs::absolute(cfg.trex_bin).string();
    p.home = p.tmp = dir.string();
    return p;
  }
  p.python_pkg = kJailPythonPkg;
  p.trex_bin = kJailTrexBin;
  p.home = kJailWorkdir;
  p.tmp = "/tmp";
  p.views = {{reachable_view(fs::canonical(fs::absolute(cfg.trex_bin))), kJailTrexBin}};
  if (with_python) p.views.push_back({reachable_view(cfg.python_pkg), kJailPythonPkg});
  return p;
}

std::vector<std::string> base_env(const JobPaths& p) {
  return {"PATH=/usr/local/bin:/usr/bin:/bin",
          "HOME=" + p.home,
          "TMPDIR=" + p.tmp,
          "LANG=C.UTF-8",
          "PYTHONPATH=" + p.python_pkg,
          "PYTHONDONTWRITEBYTECODE=1",
          "PYTHONHASHSEED=0",
          "PYTHONUNBUFFERED=1",
          "TREX_BIN=" + p.trex_bin,
          "OMP_NUM_THREADS=1",
          "OPENBLAS_NUM_THREADS=1",
          "MALLOC_ARENA_MAX=2"};
}

SandboxJob make_job(const ExecConfig& cfg, const fs::path& dir, const JobPaths& p, int slot) {
  SandboxJob job;
  job.env = base_env(p);
  job.workdir = dir;
  job.views = p.views;
  job.isolation = cfg.isolation;
  job.slot = slot;
  return job;
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
  if (r.end != SandboxEnd::StartFailed && !r.output.empty()) out.message += "\n" + r.output.substr(
      r.output.size() > 1000 ? r.output.size() - 1000 : 0);
  return true;
}

std::string tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(s.size() - n);
}

bool is_internal_var_name(const std::string& k) {
  return k.size() >= 2 && k[0] == 'v' && k.find_first_not_of("0123456789", 1) == std::string::npos;
}

void apply_solver_json(const json& j, ExecOutcome& out, bool internal_names) {
  const std::string st = j.value("status", "error");
  out.solver = j.contains("solver") && j["solver"].is_string() ? j["solver"].get<std::string>() : "";
  if (st == "optimal") {
    out.status = ExecStatus::Optimal;
    if (j.contains("objective") && j["objective"].is_number()) out.objective = j["objective"].get<double>();
    if (j.contains("values") && j["values"].is_object())
      for (const auto& [k, v] : j["values"].items())
        if (v.is_number() && (!internal_names || is_internal_var_name(k))) out.values[k] = v.get<double>();
    if (!out.objective)
      out.status = ExecStatus::SolverError, out.message = "optimal without an objective value";
  } else if (st == "infeasible") {
    out.status = ExecStatus::Infeasible;
  } else if (st == "unbounded") {
    out.status = ExecStatus::Unbounded;
  } else if (st == "infeasible_or_unbounded") {
    out.status = ExecStatus::InfeasibleOrUnbounded;
  } else if (st == "error" && out.solver.empty()) {
    out.status = ExecStatus::ProgramError;  // no solver ran: the model file did not parse
  } else {
    out.status = ExecStatus::SolverError;
  }
  if (out.message.empty() && j.contains("message") && j["message"].is_string())
    out.message = j["message"].get<std::string>();
}

// The verdict: `file_name` (text from the harness, never a path the program chose) alone in a fresh
// directory, solved by `trex solve --json` in a jail of its own. trex prints one JSON object as its last line;
// a MathProg model's own output is inside that object, so nothing else can stand in for it.
ExecOutcome solve_verdict(const std::string& file_name, const std::string& text, bool internal_names,
                          const ExecConfig& cfg, int slot) {
  ExecOutcome out;
  TempDir dir(cfg.work_root, cfg.keep_workdirs);
  write_plain(dir.path / file_name, text);
  const JobPaths paths = job_paths(cfg, dir.path, false);
  SandboxJob job = make_job(cfg, dir.path, paths, slot);
  job.workdir_writable = false;
  job.argv = {paths.trex_bin, "solve", file_name, "--json"};
  SandboxLimits lim = cfg.limits;
  lim.max_output_bytes = std::max(lim.max_output_bytes, kMaxVerdictOutputBytes);
  SandboxResult r = run_sandboxed(job, lim);
  out.seconds = r.seconds;
  if (abnormal_end(r, out)) {
    out.message = "trex solve: " + out.message;
    return out;
  }
  std::string s = r.output;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  const size_t nl = s.rfind('\n');
  const std::string last = nl == std::string::npos ? s : s.substr(nl + 1);
  json j;
  try {
    j = json::parse(last);
    if (!j.is_object() || !j.contains("status")) throw std::runtime_error("no status");
  } catch (const std::exception&) {
    out.status = ExecStatus::ProgramError;  // the file did not parse: the answer's fault
    out.message = fmt::format("trex solve: {}: {}", r.describe(), tail(s, 2000));
    return out;
  }
  apply_solver_json(j, out, internal_names);
  if (out.status == ExecStatus::SolverError && r.exit_code != 0 && out.message.empty())
    out.message = tail(s, 2000);
  return out;
}

bool plain_file_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n.find('/') == std::string::npos && n.find('\0') == std::string::npos;
}

}  // namespace

void check_isolation(const ExecConfig& config) {
  if (config.isolation == Isolation::Jail) require_jail();
}

ExecOutcome execute_python(const std::string& code, const std::map<std::string, std::string>& files,
                           GradeKind grade, const ExecConfig& config, int slot) {
  ExecConfig cfg = config;
  if (cfg.python_pkg.empty()) cfg.python_pkg = default_python_pkg();
  cfg.python_pkg = fs::absolute(cfg.python_pkg);
  const std::string python = find_python(cfg.python);
  TREX_CHECK(cfg.isolation == Isolation::None || python.rfind("/usr/", 0) == 0,
             "the jail shows only /usr of the host: the interpreter must live there (--python {})", python);
  ExecOutcome out;
  TempDir dir(cfg.work_root, cfg.keep_workdirs);
  write_plain(dir.path / "answer.py", code);
  for (const auto& [name, text] : files) {
    TREX_CHECK(plain_file_name(name) && name != "answer.py" && name[0] != '.',
               "attached file name '{}' is not a plain file name", name);
    write_plain(dir.path / name, text);
  }
  const JobPaths paths = job_paths(cfg, dir.path, true);
  SandboxJob job = make_job(cfg, dir.path, paths, slot);
  const bool lp_mode = grade == GradeKind::LpStructure;
  job.argv = {python, "-B", "-s", paths.python_pkg + "/_trex_run.py", "answer.py", lp_mode ? "lp" : "objective"};
  SandboxResult r = run_sandboxed(job, cfg.limits);
  out.seconds = r.seconds;
  if (abnormal_end(r, out)) return out;
  if (r.exit_code == kExitProgramError) {
    out.status = ExecStatus::ProgramError;
    out.message = tail(r.output, 4000);
    return out;
  }
  if (r.exit_code == kExitNoModel) {
    out.status = ExecStatus::NoModel;
    out.message = tail(r.output, 2000);
    return out;
  }
  if (r.exit_code != 0) {
    out.status = ExecStatus::ProgramError;
    out.message = fmt::format("the program ended with {}: {}", r.describe(), tail(r.output, 2000));
    return out;
  }
  std::optional<std::string> model;
  const char* file = lp_mode ? kAnswerLpFile : kModelFile;
  try {
    model = read_workdir_file(dir.path, file, kMaxModelBytes);
  } catch (const std::exception& e) {
    out.status = ExecStatus::ProgramError;
    out.message = e.what();
    return out;
  }
  if (!model) {
    out.status = ExecStatus::NoModel;
    out.message = fmt::format("the program left no model (it ended before the runner wrote it): {}",
                              tail(r.output, 2000));
    return out;
  }
  if (lp_mode) {
    out.status = ExecStatus::LpWritten;
    out.lp_text = std::move(*model);
    out.message = "LP file written by the program";
    return out;
  }
  ExecOutcome verdict = solve_verdict("model.lp", *model, /*internal_names=*/true, cfg, slot);
  verdict.seconds += out.seconds;
  if (verdict.status == ExecStatus::ProgramError)  // the look-alike wrote an LP file the reader rejects
    verdict.message = "the model the program built could not be read back: " + verdict.message;
  return verdict;
}

ExecOutcome execute_answer(const BenchItem& item, const ExtractedCode& code, GradeKind grade,
                           const ExecConfig& config, int slot) {
  if (grade == GradeKind::LpStructure && code.format == CodeFormat::Lp) {
    ExecOutcome out;  // the answer is the LP file itself
    out.status = ExecStatus::LpWritten;
    out.lp_text = code.code;
    out.message = "LP answer";
    return out;
  }
  switch (code.format) {
    case CodeFormat::Python: {
      const json data = item.data.is_null() ? json{{"question", item.question}} : item.data;
      return execute_python(code.code, {{"data.json", data.dump()}}, grade, config, slot);
    }
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
      const char* name = code.format == CodeFormat::Lp    ? "answer.lp"
                         : code.format == CodeFormat::Mps ? "answer.mps"
                                                          : "answer.mod";
      return solve_verdict(name, code.code, /*internal_names=*/false, config, slot);
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
