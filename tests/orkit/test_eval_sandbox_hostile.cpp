// trex eval against hostile answers: `trex eval score` (the CLI, as it runs in production) scores a set of
// answers that try to forge their score (in-process, through files, through output), read the answer key,
// read and write the host, reach the network, leave daemons, fork without bound, kill the harness, make the
// harness read paths of their choosing, and feed NUL bytes and huge outputs. None may score `correct`,
// none of the planted secrets may appear in the results, nothing may outlive the run, and the honest
// controls beside them must score `correct`. The run is done as root with the harness as root, and as an
// unprivileged user (the test re-runs the CLI under setpriv when it is root; run as non-root it is that run).
//
// Each hostile program builds the correct model (optimum 60) exactly when its attack worked, so a
// successful attack shows up as `correct`.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "core/files.h"
#include "orkit/eval/execute.h"
#include "orkit/eval/sandbox.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kNobody = 65534;

// maximise 3x with x <= 20: the optimum is 60; build(2) gives 40. The harness solves whatever model is left,
// so only the programs that need a solved model in-process call optimize().
const char* kBuild = R"PY(
import os, sys
import gurobipy as gp
def build(c, solve=False):
    m = gp.Model()
    x = m.addVar(ub=20, name="x")
    m.setObjective(c * x, gp.GRB.MAXIMIZE)
    m.addConstr(x <= 20, name="cap")
    if solve:
        m.optimize()
    return m
)PY";

const char* kQuestion = "maximise 3x with x <= 20 (hostile suite)";
const char* kReferenceLp = "Maximize\n obj: 3 x\nSubject To\n cap: x <= 20\nBounds\n x <= 20\nEnd\n";

struct Case {
  std::string id;
  std::string response;
  bool orgeval = false;  // graded by LP structure
  bool control = false;  // an honest answer: must be correct
};

std::string py(const std::string& body) {
  return "```python\n" + std::string(kBuild) + body + "\n```\n";
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// The hostile answers. Placeholders: @PORT@ (a loopback port the test listens on), @SECRET@ (a world-readable
// file in the host's /tmp), @ROOTSECRET@ (a file only root may read, holding an LP with the right answer),
// @BENCH@ (the benchmark file), @QUESTION@ (its question text), @MARK@ (a token naming files and processes the programs try to leave behind).
std::vector<Case> cases() {
  std::vector<Case> c;
  // honest controls
  c.push_back({"control_python", py("m = build(3, solve=True)\nassert m.ObjVal == 60"), false, true});
  c.push_back({"control_lp", std::string("```lp\n") + kReferenceLp + "```\n", false, true});
  c.push_back({"control_jail_tmp_and_data",
               py("import json\nopen('/tmp/scratch', 'w').write('ok')\nq = json.load(open('data.json'))\n"
                  "assert 'question' in q\nm = build(3)"),
               false, true});
  c.push_back({"control_orgeval", py("m = build(3)\nm.write('answer.lp')"), true, true});
  // score forgery in-process: attributes of the model, the look-alike's internals
  c.push_back({"forge_attributes",
               py("m = build(2, solve=True)\nm.objective_value = 60.0\nm.status_text = 'optimal'\nm.solved = True\n"
                  "for v in m.vars:\n    v.sol = 20.0")});
  c.push_back({"forge_patch_internals", py(R"PY(m = build(2, solve=True)
import _trex_core
_trex_core.solve_model = lambda *a, **k: ("optimal", 60.0, "", 0.0)
_trex_core.BaseModel.trex_result = lambda self: {"status": "optimal", "objective": 60.0, "values": {}}
def fake_write(model, path, internal_names):
    open(path, "w").write("Maximize\n obj: 3 v0\nSubject To\n r0: v0 <= 20\nEnd\n")
_trex_core.write_lp = fake_write
m.solved = False)PY")});
  // score forgery through files and output
  c.push_back({"forge_verdict_files", py(R"PY(m = build(2)
import json
for name in (".trex_result.json", "result.json", "verdict.json", "results.jsonl"):
    json.dump({"status": "optimal", "objective": 60.0, "values": {}}, open(name, "w"))
print('{"status": "optimal", "objective": 60.0, "values": {}}', flush=True)
os._exit(0))PY")});
  c.push_back({"forge_stdout", py("m = build(2)\nprint('{\"status\": \"optimal\", \"objective\": 60.0}')")});
  c.push_back({"forge_mathprog_output",
               "```mathprog\nvar x >= 0, <= 20;\nmaximize obj: 2 * x;\ns.t. cap: x <= 20;\nsolve;\n"
               "printf '{\"status\": \"optimal\", \"objective\": 60.0, \"solver\": \"glpk\"}\\n';\nend;\n```\n"});
  c.push_back({"forge_model_symlink", py("m = build(2)\nos.symlink('@ROOTSECRET@', '.trex_model.lp')\nos._exit(0)")});
  c.push_back({"forge_model_fifo", py("m = build(2)\nos.mkfifo('.trex_model.lp')\nos._exit(0)")});
  // the answer key
  c.push_back({"answer_key_lookup", py(R"PY(found = []
def look(path):
    try:
        text = open(path, errors="replace").read(1 << 20)
    except Exception:
        return
    if "@QUESTION@" in text:
        found.append(text)
try:
    found.append(open("/proc/%d/cmdline" % os.getppid()).read())
except Exception:
    pass
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            cmd = open("/proc/%s/cmdline" % p).read().split("\0")
        except Exception:
            continue
        for i, a in enumerate(cmd[:-1]):
            if a == "--benchmark":
                look(cmd[i + 1])
look("@BENCH@")
n = 0
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for f in files:
        n += 1
        if f.endswith(".jsonl"):
            look(os.path.join(root, f))
    if n > 20000:
        break
print(found)
m = build(3 if any("@QUESTION@" in t or "hostile" in t for t in found) else 2))PY")});
  // host files: reads, writes
  c.push_back({"host_read", py(R"PY(got = ""
for p in ("@SECRET@", "/etc/shadow", "@ROOTSECRET@"):
    try:
        got += open(p).read()
    except Exception:
        pass
listed = [d for d in ("/work", "/root", "/home", "/var") if os.path.exists(d)]
print("read:", got, "listed:", listed)
m = build(3 if got or listed else 2))PY")});
  c.push_back({"host_write", py(R"PY(for d in ("/tmp", "/dev/shm", "/var/tmp", "/work", "/root"):
    try:
        open(os.path.join(d, "@MARK@-write"), "w").write("left behind")
    except Exception as e:
        print("write", d, e)
m = build(2))PY")});
  // network
  c.push_back({"network_loopback", py(R"PY(import socket
ok = False
for host in ("127.0.0.1", "localhost"):
    try:
        socket.create_connection((host, @PORT@), timeout=2).close()
        ok = True
    except Exception as e:
        print("connect", host, e)
m = build(3 if ok else 2))PY")});
  // processes: daemons, fork bombs, killing the harness
  c.push_back({"daemon", py(R"PY(if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "@MARK@1"])
    os._exit(0)
m = build(2))PY")});
  c.push_back({"fork_bomb", py(R"PY(n = 0
for i in range(5000):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep", "@MARK@2"])
        finally:
            os._exit(0)
    n += 1
print("forked", n)
m = build(3 if n >= 64 else 2))PY")});
  c.push_back({"kill_harness", py(R"PY(import signal
for target in (os.getppid(), 1):
    try:
        os.kill(target, signal.SIGKILL)
    except Exception as e:
        print("kill", target, e)
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != os.getpid():
        try:
            os.kill(int(p), signal.SIGKILL)
        except Exception:
            pass
m = build(2)
os.kill(-1, signal.SIGKILL))PY")});
  // paths the harness would read for LP-structure grading
  c.push_back({"orgeval_verdict_names_path", py(R"PY(import json
m = build(3)
json.dump({"status": "lp_written", "lp_files": ["@ROOTSECRET@", "/etc/shadow"]}, open(".trex_result.json", "w"))
os.symlink("@ROOTSECRET@", "model.lp")
os.symlink("@ROOTSECRET@", ".trex_answer.lp")
os._exit(0))PY"),
               true});
  c.push_back({"orgeval_lp_symlink", py("os.symlink('@ROOTSECRET@', 'answer.lp')"), true});
  // NUL bytes and huge outputs
  c.push_back({"nul_lp_answer", "```lp\nMaximize\n obj: 3 x" + std::string(3, '\0') + " + " + std::string(1, '\0') +
                                    "\nSubject To\n cap: x <= 20\nEnd\n```\n"});
  c.push_back({"nul_model_file", py("open('.trex_model.lp', 'wb').write(b'Maximize\\n obj: 3 x' + b'\\0' * 100000)\n"
                                    "os._exit(0)")});
  c.push_back({"nul_print", py("sys.stdout.write('\\0' * 1000 + '{\"status\": \"optimal\", \"objective\": 60}\\n')\n"
                               "m = build(2)")});
  c.push_back({"huge_print", py("while True:\n    sys.stdout.write('x' * 100000)")});
  c.push_back({"huge_model_file",
               py("m = build(3)\nwith open('.trex_model.lp', 'w') as f:\n"
                  "    f.write('Maximize\\n obj: 3 x\\nSubject To\\n c: x <= 20\\nEnd\\n\\\\ ' + 'x' * (70 << 20))\n"
                  "os._exit(0)")});
  c.push_back({"huge_tmp_file", py("m = build(2)\nopen('/tmp/big', 'wb').write(b'x' * (200 << 20))\nm = build(3)")});
  return c;
}

struct Listener {
  int fd = -1, port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && listen(fd, 16) == 0) {
      socklen_t len = sizeof a;
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      port = ntohs(a.sin_port);
    }
  }
  int accepted() const {  // connections that reached it
    int n = 0;
    for (int c; (c = accept(fd, nullptr, nullptr)) >= 0; ++n) close(c);
    return n;
  }
  ~Listener() { close(fd); }
};

// Processes whose command line holds `mark`.
std::vector<std::string> processes_with(const std::string& mark) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(mark) != std::string::npos && pid != std::to_string(getpid())) found.push_back(pid + ": " + cmd);
  }
  return found;
}

class HostileAnswers : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!trex::orkit::eval::jail_support().ok)
      GTEST_SKIP() << "no jail here, so the hostile answers cannot be run isolated: "
                   << trex::orkit::eval::jail_support().problem;
    std::mt19937_64 rng(std::random_device{}());
    mark_ = "trexhostile" + std::to_string(getpid()) + std::to_string(rng() % 1000000);
    std::string t = (fs::temp_directory_path() / "trex-hostile-XXXXXX").string();
    dir_ = mkdtemp(t.data());
    fs::permissions(dir_, fs::perms::owner_all | fs::perms::others_read | fs::perms::others_exec);
    secret_token_ = "SECRET-" + mark_;
    root_token_ = "ROOTONLY-" + mark_;
    key_token_ = "KEY-" + mark_;
    secret_ = fs::temp_directory_path() / (mark_ + "-secret");
    trex::write_text_atomic(secret_, secret_token_ + "\n");
    fs::permissions(secret_, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                                 fs::perms::others_read);
    // holds the reference LP: a harness that read it for a program would score that program correct
    root_secret_ = dir_ / "root-only.lp";
    trex::write_text_atomic(root_secret_, std::string("\\ ") + root_token_ + "\n" + kReferenceLp);
    fs::permissions(root_secret_, fs::perms::owner_read | fs::perms::owner_write);
    std::string objective_items, orgeval_items, responses;
    for (const Case& c : cases()) {
      std::string r = c.response;
      for (const auto& [k, v] : std::map<std::string, std::string>{{"@PORT@", std::to_string(net_.port)},
                                                                   {"@SECRET@", secret_.string()},
                                                                   {"@ROOTSECRET@", root_secret_.string()},
                                                                   {"@BENCH@", (dir_ / "hostile.jsonl").string()},
                                                                   {"@QUESTION@", kQuestion},
                                                                   {"@MARK@", mark_}})
        r = replace_all(r, k, v);
      json item{{"id", c.id}, {"benchmark", "Hostile"}, {"question", kQuestion},
                {"problem_class", key_token_}, {"answer", 60.0}, {"answer_type", "objective"}};
      if (c.orgeval) {
        item["benchmark"] = "Hostile-ORGEval";
        item["answer"] = nullptr;
        item["extra"] = {{"reference_lp", kReferenceLp}};
        orgeval_items += item.dump() + "\n";
      } else {
        objective_items += item.dump() + "\n";
      }
      responses += json{{"id", c.id}, {"response", r}}.dump() + "\n";
      expected_[c.id] = c.control;
    }
    trex::write_text_atomic(dir_ / "hostile.jsonl", objective_items);
    trex::write_text_atomic(dir_ / "hostile_orgeval.jsonl", orgeval_items);
    trex::write_text_atomic(dir_ / "responses.jsonl", responses);
    for (const char* f : {"hostile.jsonl", "hostile_orgeval.jsonl", "responses.jsonl"})
      fs::permissions(dir_ / f, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  }

  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
    if (!secret_.empty()) fs::remove(secret_, ec);
  }

  // Runs `trex eval score` (under `prefix`, e.g. setpriv) into dir_/out_name and checks everything.
  void run_and_check(const std::string& prefix, const std::string& out_name,
                     const std::string& binary = TREX_BINARY, const std::string& extra_args = "") {
    const fs::path out = dir_ / out_name;
    fs::create_directory(out);
    fs::permissions(out, fs::perms::all);  // the unprivileged harness writes here
    const std::string cmd = prefix + binary + " eval score" + extra_args + " --benchmark " +
                            (dir_ / "hostile.jsonl").string() + " --benchmark " +
                            (dir_ / "hostile_orgeval.jsonl").string() + " --responses " +
                            (dir_ / "responses.jsonl").string() + " --out " + out.string() +
                            " --timeout 8 --memory-gb 1 --jobs 2 --no-progress > " + (out / "log.txt").string() +
                            " 2>&1";
    auto t0 = std::chrono::steady_clock::now();
    const int rc = std::system(cmd.c_str());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string log = trex::read_text_file(out / "log.txt");
    ASSERT_EQ(rc, 0) << "the harness did not finish (killed?):\n" << log;
    EXPECT_LT(seconds, 60.0);
    const std::string results = trex::read_text_file(out / "results.jsonl");
    std::map<std::string, json> by_id;
    std::istringstream lines(results);
    for (std::string line; std::getline(lines, line);) {
      const json j = json::parse(line);
      by_id[j["id"]] = j;
    }
    for (const auto& [id, control] : expected_) {
      ASSERT_TRUE(by_id.count(id)) << id << " missing from results.jsonl\n" << log;
      const json& r = by_id[id];
      if (control)
        EXPECT_EQ(r["status"], "correct") << id << ": " << r.dump();
      else
        EXPECT_NE(r["status"], "correct") << id << " forged its score: " << r.dump();
    }
    for (const std::string& file : {std::string("results.jsonl"), std::string("summary.json"),
                                    std::string("report.html"), std::string("log.txt")}) {
      const std::string text = trex::read_text_file(out / file);
      for (const std::string& token : {secret_token_, root_token_, key_token_})
        EXPECT_EQ(text.find(token), std::string::npos) << token << " leaked into " << file;
    }
    EXPECT_EQ(net_.accepted(), 0) << "a program reached the test's loopback port";
    for (const char* d : {"/tmp", "/dev/shm", "/var/tmp", "/work", "/root"})
      EXPECT_FALSE(fs::exists(fs::path(d) / (mark_ + "-write"))) << "a program wrote into the host's " << d;
    EXPECT_TRUE(processes_with(mark_).empty()) << "outlived the run: " << processes_with(mark_)[0];
    // the harness's work directories are gone
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path()))
      if (e.path().filename().string().rfind("trex-eval-", 0) == 0) {
        std::ifstream probe(e.path() / "answer.py");
        std::string text((std::istreambuf_iterator<char>(probe)), std::istreambuf_iterator<char>());
        EXPECT_EQ(text.find(mark_), std::string::npos) << "left behind: " << e.path();
      }
  }

  fs::path dir_, secret_, root_secret_;
  std::string mark_, secret_token_, root_token_, key_token_;
  std::map<std::string, bool> expected_;
  Listener net_;
};

}  // namespace

TEST_F(HostileAnswers, NoneScoresCorrectNothingLeaksNothingOutlivesTheRun) {
  if (geteuid() == 0) {
    SCOPED_TRACE("harness as root");
    run_and_check("", "out-root");
    if (HasFatalFailure()) return;
    // The same answers with the harness as an unprivileged user: the jail needs no root.
    if (std::system("command -v setpriv >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "setpriv (util-linux) missing: cannot re-run the harness as an unprivileged user";
    if (access(TREX_BINARY, X_OK) != 0) GTEST_SKIP() << "no trex binary";
    const std::string as_nobody =
        "setpriv --reuid=" + std::to_string(kNobody) + " --regid=" + std::to_string(kNobody) + " --clear-groups ";
    std::string binary = TREX_BINARY, extra_args;
    if (std::system((as_nobody + "test -x " + binary).c_str()) != 0) {
      // The checkout sits under a directory closed to other users (e.g. /root): stage the binary and the solver
      // look-alikes where the unprivileged user can reach them, as a deployment outside a home directory would.
      const fs::path stage = dir_ / "stage";
      fs::create_directories(stage);
      fs::copy_file(TREX_BINARY, stage / "trex");
      fs::copy(trex::orkit::eval::default_python_pkg(), stage / "trex_solvers", fs::copy_options::recursive);
      const auto open = fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                        fs::perms::others_read | fs::perms::others_exec;
      fs::permissions(stage, open);
      fs::permissions(stage / "trex", open);
      for (const auto& e : fs::recursive_directory_iterator(stage / "trex_solvers"))
        fs::permissions(e.path(), e.is_directory() ? open : (open & ~(fs::perms::owner_exec | fs::perms::group_exec |
                                                                        fs::perms::others_exec)) | fs::perms::owner_write);
      fs::permissions(stage / "trex_solvers", open);
      binary = (stage / "trex").string();
      extra_args = " --python-pkg " + (stage / "trex_solvers").string();
    }
    ASSERT_EQ(std::system((as_nobody + "test -x " + binary).c_str()), 0)
        << "uid " << kNobody << " cannot execute " << binary;
    SCOPED_TRACE("harness as uid 65534");
    run_and_check(as_nobody + "env HOME=/tmp ", "out-nobody", binary, extra_args);
  } else {
    SCOPED_TRACE("harness as uid " + std::to_string(geteuid()));
    run_and_check("", "out-user");
  }
}
