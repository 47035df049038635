#include "orkit/solve/mathprog.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>

#include "core/error.h"
#include "core/files.h"
#include "orkit/lp/model_util.h"
#include "orkit/lp/text_input.h"
#include "orkit/solve/glpk_model.h"

namespace trex::orkit {

#ifdef TREX_HAVE_GLPK

namespace {

int capture_hook(void* info, const char* s) {
  static_cast<std::string*>(info)->append(s);
  return 1;  // handled: GLPK prints nothing itself
}

// A text given in memory goes to a private temporary file (GLPK's translator reads files only).
class TempFile {
 public:
  TempFile(std::string_view text, const char* ext) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("trex-mpl-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + ext);
    std::ofstream f(path_, std::ios::binary);
    TREX_CHECK(f.good(), "cannot create temporary file {}", path_.string());
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    TREX_CHECK(f.good(), "cannot write temporary file {}", path_.string());
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// Owns the translator workspace, the generated problem and the terminal capture.
class Translation {
 public:
  Translation(const std::filesystem::path& model_file, const std::optional<std::filesystem::path>& data_file,
              std::string model_label, std::string data_label, bool generate = true)
      : model_file_(model_file.string()), model_label_(std::move(model_label)), data_label_(std::move(data_label)) {
    if (data_file) data_file_ = data_file->string();
    glp_term_hook(capture_hook, &captured_);
    tran_ = glp_mpl_alloc_wksp();
    if (glp_mpl_read_model(tran_, model_file_.c_str(), data_file ? 1 : 0) != 0) failure("translation");
    if (data_file && glp_mpl_read_data(tran_, data_file_.c_str()) != 0) failure("reading data");
    if (!generate) return;
    if (glp_mpl_generate(tran_, nullptr) != 0) failure("generation");
    prob_ = glp_create_prob();
    glp_mpl_build_prob(tran_, prob_);
  }
  ~Translation() {
    if (prob_) glp_delete_prob(prob_);
    if (tran_) glp_mpl_free_wksp(tran_);
    glp_term_hook(nullptr, nullptr);
  }
  Translation(const Translation&) = delete;
  Translation& operator=(const Translation&) = delete;

  glp_prob* problem() { return prob_; }
  glp_tran* tran() { return tran_; }
  std::string output() const { return relabel(captured_); }

 private:
  std::string relabel(std::string s) const {
    s = replace_all(std::move(s), model_file_, model_label_);
    if (!data_file_.empty()) s = replace_all(std::move(s), data_file_, data_label_);
    return s;
  }
  [[noreturn]] void failure(const char* stage) {
    std::string text = relabel(captured_);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    glp_mpl_free_wksp(tran_);
    tran_ = nullptr;
    glp_term_hook(nullptr, nullptr);
    fail("MathProg {} failed for {}: {}", stage, model_label_, text);
  }

  std::string model_file_, data_file_, model_label_, data_label_;
  std::string captured_;
  glp_tran* tran_ = nullptr;
  glp_prob* prob_ = nullptr;
};

MathProgResult run(Translation& t, const SolveOptions& options) {
  MathProgResult out;
  out.model = model_from_glpk(t.problem());
  const SolverKind kind =
      options.solver == SolverKind::Auto ? SolverKind::Glpk : choose_solver(out.model, options.solver);
  if (kind == SolverKind::Glpk) {
    const auto t0 = std::chrono::steady_clock::now();
    out.result = detail::solve_glpk_problem(t.problem(), out.model, options);
    if (!out.result.values.empty()) out.result.objective = objective_value(out.model, out.result.values);
    out.result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (out.result.status == SolveStatus::Optimal || out.result.status == SolveStatus::Limit) {
      const int sol = out.model.has_integers() ? GLP_MIP : GLP_SOL;
      glp_mpl_postsolve(t.tran(), t.problem(), sol);
    }
  } else {
    SolveOptions o = options;
    o.solver = kind;
    out.result = solve(out.model, o);
  }
  out.output = t.output();
  return out;
}

// GLPK's translator reads bytes as they come; binary input is refused first with the byte offset.
void require_mathprog_text(std::string_view model_text, std::string_view data_text, const std::string& source) {
  require_text(model_text, source, "MathProg model");
  require_text(data_text, source + " (data)", "MathProg data file");
}

void require_mathprog_files(const std::filesystem::path& model_file,
                            const std::optional<std::filesystem::path>& data_file) {
  TREX_CHECK(std::filesystem::exists(model_file), "MathProg model file {} does not exist", model_file.string());
  require_text(read_text_file(model_file), model_file.string(), "MathProg model");
  if (data_file) require_text(read_text_file(*data_file), data_file->string(), "MathProg data file");
}

}  // namespace

void check_mathprog_syntax(std::string_view model_text, std::string_view data_text, const std::string& source) {
  require_mathprog_text(model_text, data_text, source);
  TempFile mod(model_text, ".mod");
  std::optional<TempFile> dat;
  if (!data_text.empty()) dat.emplace(data_text, ".dat");
  Translation t(mod.path(), dat ? std::optional(dat->path()) : std::nullopt, source, source + " (data)", false);
}

Model mathprog_to_model(std::string_view model_text, std::string_view data_text, const std::string& source) {
  require_mathprog_text(model_text, data_text, source);
  TempFile mod(model_text, ".mod");
  std::optional<TempFile> dat;
  if (!data_text.empty()) dat.emplace(data_text, ".dat");
  Translation t(mod.path(), dat ? std::optional(dat->path()) : std::nullopt, source, source + " (data)");
  return model_from_glpk(t.problem());
}

Model mathprog_file_to_model(const std::filesystem::path& model_file,
                             const std::optional<std::filesystem::path>& data_file) {
  require_mathprog_files(model_file, data_file);
  Translation t(model_file, data_file, model_file.string(), data_file ? data_file->string() : "");
  Model m = model_from_glpk(t.problem());
  if (m.name.empty()) m.name = model_file.stem().string();
  return m;
}

MathProgResult solve_mathprog(std::string_view model_text, std::string_view data_text, const SolveOptions& options,
                              const std::string& source) {
  require_mathprog_text(model_text, data_text, source);
  TempFile mod(model_text, ".mod");
  std::optional<TempFile> dat;
  if (!data_text.empty()) dat.emplace(data_text, ".dat");
  Translation t(mod.path(), dat ? std::optional(dat->path()) : std::nullopt, source, source + " (data)");
  return run(t, options);
}

MathProgResult solve_mathprog_file(const std::filesystem::path& model_file,
                                   const std::optional<std::filesystem::path>& data_file,
                                   const SolveOptions& options) {
  require_mathprog_files(model_file, data_file);
  Translation t(model_file, data_file, model_file.string(), data_file ? data_file->string() : "");
  return run(t, options);
}

#else

void check_mathprog_syntax(std::string_view, std::string_view, const std::string&) {
  fail("MathProg needs GLPK, which was not built into this trex");
}
Model mathprog_to_model(std::string_view, std::string_view, const std::string&) {
  fail("MathProg needs GLPK, which was not built into this trex");
}
Model mathprog_file_to_model(const std::filesystem::path&, const std::optional<std::filesystem::path>&) {
  fail("MathProg needs GLPK, which was not built into this trex");
}
MathProgResult solve_mathprog(std::string_view, std::string_view, const SolveOptions&, const std::string&) {
  fail("MathProg needs GLPK, which was not built into this trex");
}
MathProgResult solve_mathprog_file(const std::filesystem::path&, const std::optional<std::filesystem::path>&,
                                   const SolveOptions&) {
  fail("MathProg needs GLPK, which was not built into this trex");
}

#endif

}  // namespace trex::orkit
