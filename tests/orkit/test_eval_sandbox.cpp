// trex eval: the jail (limits, kill of the whole namespace, network and file-system isolation, distinct
// identities per job, reading a program's files only by name) and the statuses that wrong programs get.
// The hostile-answer suite is test_eval_sandbox_hostile.cpp.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "core/files.h"
#include "orkit/eval/runner.h"
#include "orkit/eval/sandbox.h"

using namespace trex::orkit::eval;
namespace fs = std::filesystem;

namespace {

struct Dir {
  fs::path p;
  Dir() {
    std::string t = (fs::temp_directory_path() / "trex-sbx-XXXXXX").string();
    p = mkdtemp(t.data());
    fs::permissions(p, fs::perms::owner_all | fs::perms::others_read | fs::perms::others_exec);
  }
  ~Dir() { fs::remove_all(p); }
};

std::vector<std::string> env() {
  return {"PATH=/usr/bin:/bin", "LANG=C.UTF-8"};
}

#define REQUIRE_JAIL() \
  if (!jail_support().ok) GTEST_SKIP() << "no jail here: " << jail_support().problem

SandboxResult run_in(const fs::path& dir, const std::vector<std::string>& argv, SandboxLimits lim = {},
                     int slot = 0, Isolation iso = Isolation::Jail) {
  SandboxJob job;
  job.argv = argv;
  job.env = env();
  job.workdir = dir;
  job.isolation = iso;
  job.slot = slot;
  return run_sandboxed(job, lim);
}

SandboxResult sh(const std::string& script, SandboxLimits lim = {}, Isolation iso = Isolation::Jail) {
  Dir d;
  return run_in(d.p, {"/bin/sh", "-c", script}, lim, 0, iso);
}

ExecConfig exec_config(double timeout) {
  ExecConfig c;
  c.trex_bin = TREX_BINARY;
  c.limits.wall_seconds = timeout;
  c.limits.memory_bytes = size_t(1) << 30;
  c.limits.max_output_bytes = 256 << 10;
  return c;
}

BenchItem item(double answer) {
  BenchItem it;
  it.id = "t";
  it.benchmark = "test";
  it.question = "q";
  it.answer = answer;
  return it;
}

ItemResult score_python(const std::string& code, double timeout = 10.0, double answer = 60.0) {
  const std::string response = "```python\n" + code + "\n```\n";
  return score_item(item(answer), &response, Rule::Relative, exec_config(timeout), 0);
}

// The number after `key` in `text`, or -1.
int number_after(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  if (at == std::string::npos) return -1;
  try {
    return std::stoi(text.substr(at + key.size()));
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

TEST(EvalSandbox, CapturesOutputAndExitCode) {
  REQUIRE_JAIL();
  auto r = sh("echo hello; echo err >&2; exit 3");
  EXPECT_TRUE(r.jailed);
  EXPECT_EQ(r.end, SandboxEnd::Exited);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.output.find("hello"), std::string::npos);
  EXPECT_NE(r.output.find("err"), std::string::npos);
  auto k = sh("kill -9 $$");
  EXPECT_EQ(k.end, SandboxEnd::Signaled);
  EXPECT_EQ(k.signal, 9);
}

TEST(EvalSandbox, WallClockLimitKillsTheWholeNamespace) {
  REQUIRE_JAIL();
  SandboxLimits lim;
  lim.wall_seconds = 1.0;
  auto t0 = std::chrono::steady_clock::now();
  // a background child that would outlive its parent keeps the pipe open: it must die too
  auto r = sh("sleep 60 & sleep 60; echo never", lim);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.end, SandboxEnd::WallTimeout);
  EXPECT_LT(s, 10.0);
  EXPECT_EQ(r.output.find("never"), std::string::npos);
}

TEST(EvalSandbox, LeftoverBackgroundProcessesAreKilled) {
  REQUIRE_JAIL();
  SandboxLimits lim;
  lim.wall_seconds = 20.0;
  auto t0 = std::chrono::steady_clock::now();
  auto r = sh("(sleep 30; echo late) & (setsid sleep 30 &) ; echo done", lim);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.end, SandboxEnd::Exited);
  EXPECT_LT(s, 10.0);  // did not wait for the orphans
  EXPECT_EQ(r.output.find("late"), std::string::npos);
}

TEST(EvalSandbox, OutputIsCapped) {
  REQUIRE_JAIL();
  SandboxLimits lim;
  lim.max_output_bytes = 64 << 10;
  lim.wall_seconds = 20.0;
  auto r = sh("yes trex", lim);
  EXPECT_EQ(r.end, SandboxEnd::OutputLimit);
  EXPECT_LE(r.output.size(), size_t(64 << 10));
}

TEST(EvalSandbox, WithoutJailStillCapsTimeAndOutput) {
  auto r = sh("echo plain; exit 4", {}, Isolation::None);
  EXPECT_EQ(r.end, SandboxEnd::Exited);
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_FALSE(r.jailed);
  EXPECT_NE(r.output.find("plain"), std::string::npos);
  SandboxLimits lim;
  lim.wall_seconds = 1.0;
  EXPECT_EQ(sh("sleep 30", lim, Isolation::None).end, SandboxEnd::WallTimeout);
}

TEST(EvalSandbox, ForkBombIsContained) {
  REQUIRE_JAIL();
  SandboxLimits lim;
  lim.wall_seconds = 5.0;
  lim.max_processes = 32;
  auto t0 = std::chrono::steady_clock::now();
  // tries to start 200 sleepers and reports how many it got: the limit holds inside the jail whether the
  // harness is root or not, and the sleepers die with the jail
  Dir d;
  const std::string py =
      "import os, time\nn = 0\nfor i in range(200):\n    try:\n        pid = os.fork()\n"
      "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
      "    n += 1\nprint('started', n, flush=True)\n";
  auto r = run_in(d.p, {"/usr/bin/python3", "-c", py}, lim);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.jailed);
  EXPECT_LT(s, 15.0);
  EXPECT_EQ(r.end, SandboxEnd::Exited) << r.describe();
  const int started = number_after(r.output, "started ");
  EXPECT_GE(started, 10) << r.output;
  EXPECT_LE(started, 36) << r.output;
}

TEST(EvalSandbox, JailSeesOnlyItsOwnViews) {
  REQUIRE_JAIL();
  const fs::path secret = fs::temp_directory_path() / ("trex_jail_secret_" + std::to_string(getpid()));
  trex::write_text_atomic(secret, "host secret");
  fs::permissions(secret, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  auto r = sh("ls -a /; cat " + secret.string() + " 2>&1; echo procs $(ls /proc | grep -c '^[0-9]'); hostname");
  fs::remove(secret);
  ASSERT_EQ(r.end, SandboxEnd::Exited) << r.output;
  EXPECT_EQ(r.output.find("host secret"), std::string::npos) << r.output;
  for (const char* hidden : {"\nwork\n", "\nhome\n", "\nroot\n", "\nvar\n", "\nrun\n"})
    EXPECT_EQ(r.output.find(hidden), std::string::npos) << hidden << " in " << r.output;
  EXPECT_NE(r.output.find("\nsandbox\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("trex-jail"), std::string::npos) << r.output;
  // its own PID namespace: bwrap's init, the shell and the commands of the pipeline
  const int procs = number_after(r.output, "procs ");
  EXPECT_GE(procs, 1) << r.output;
  EXPECT_LE(procs, 6) << r.output;
}

TEST(EvalSandbox, EveryJobSlotHasItsOwnIdentityAndCleanUp) {
  REQUIRE_JAIL();
  // slots 6 and 70 shared a uid under the old `slot % 64`, and the first to finish killed the other
  Dir a, b;
  SandboxResult slow, fast;
  std::thread t([&] { slow = run_in(a.p, {"/bin/sh", "-c", "sleep 2; echo survived"}, {}, 70); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  fast = run_in(b.p, {"/bin/sh", "-c", "sleep 30 & echo quick"}, {}, 6);
  t.join();
  EXPECT_EQ(fast.end, SandboxEnd::Exited);
  EXPECT_EQ(slow.end, SandboxEnd::Exited) << slow.describe();
  EXPECT_NE(slow.output.find("survived"), std::string::npos) << slow.output;
  if (geteuid() == 0) {
    EXPECT_EQ(slow.host_uid, kJailUidBase + 70);
    EXPECT_EQ(fast.host_uid, kJailUidBase + 6);
  }
  EXPECT_EQ(jail_host_uid(100000), kJailUidBase + 100000);  // no wrap-around at any job count
  EXPECT_THROW(jail_host_uid(int(kJailUidCount)), std::exception);
}

TEST(EvalSandbox, ReadWorkdirFileTakesOnlyRegularFilesByName) {
  Dir d;
  trex::write_text_atomic(d.p / "ok.lp", "min: x;");
  EXPECT_EQ(*read_workdir_file(d.p, "ok.lp", 100), "min: x;");
  EXPECT_FALSE(read_workdir_file(d.p, "absent.lp", 100).has_value());
  EXPECT_THROW(read_workdir_file(d.p, "ok.lp", 3), std::exception);       // too large
  EXPECT_THROW(read_workdir_file(d.p, "../ok.lp", 100), std::exception);  // not a plain name
  fs::create_symlink("/etc/passwd", d.p / "link.lp");
  EXPECT_THROW(read_workdir_file(d.p, "link.lp", 1 << 20), std::exception);  // symbolic link
  ASSERT_EQ(mkfifo((d.p / "fifo.lp").c_str(), 0644), 0);
  EXPECT_THROW(read_workdir_file(d.p, "fifo.lp", 100), std::exception);  // refused, without blocking
  fs::create_directory(d.p / "dir.lp");
  EXPECT_THROW(read_workdir_file(d.p, "dir.lp", 100), std::exception);
}

TEST(EvalSandbox, NetworkNamespaceBlocksLoopbackOfTheHost) {
  REQUIRE_JAIL();
  int srv = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(srv, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(srv, 4), 0);
  socklen_t len = sizeof a;
  getsockname(srv, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  SandboxLimits lim;
  lim.wall_seconds = 10.0;
  Dir d;
  const std::string py = "import socket\ns = socket.create_connection(('127.0.0.1', " + std::to_string(port) +
                         "), timeout=3)\nprint('connected')\n";
  auto r = run_in(d.p, {"/usr/bin/python3", "-c", py}, lim);
  close(srv);
  EXPECT_TRUE(r.jailed);
  EXPECT_EQ(r.end, SandboxEnd::Exited);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.output.find("connected"), std::string::npos) << r.output;
}

TEST(EvalStatuses, CorrectProgramIsCorrect) {
  REQUIRE_JAIL();
  auto r = score_python(
      "import gurobipy as gp\nm = gp.Model()\nx = m.addVar(ub=20)\n"
      "m.setObjective(3 * x, gp.GRB.MAXIMIZE)\nm.optimize()");
  EXPECT_EQ(r.status, "correct") << r.message;
  ASSERT_TRUE(r.predicted.has_value());
  EXPECT_DOUBLE_EQ(*r.predicted, 60.0);
}

TEST(EvalStatuses, UnsolvedModelIsSolvedByTheHarness) {
  REQUIRE_JAIL();
  auto r = score_python(
      "import gurobipy as gp\nm = gp.Model()\nx = m.addVar(ub=20)\nm.setObjective(3 * x, gp.GRB.MAXIMIZE)");
  EXPECT_EQ(r.status, "correct") << r.message;
}

TEST(EvalStatuses, WithoutJailTheSameVerdicts) {
  ExecConfig c = exec_config(10.0);
  c.isolation = Isolation::None;
  const std::string right = "```python\nimport gurobipy as gp\nm = gp.Model()\nx = m.addVar(ub=20)\n"
                            "m.setObjective(3 * x, gp.GRB.MAXIMIZE)\nm.optimize()\n```\n";
  EXPECT_EQ(score_item(item(60.0), &right, Rule::Relative, c, 0).status, "correct");
  const std::string lp = "```lp\nMaximize\n obj: 2 x\nSubject To\n c: x <= 20\nEnd\n```\n";
  EXPECT_EQ(score_item(item(60.0), &lp, Rule::Relative, c, 0).status, "wrong");
}

TEST(EvalStatuses, WrongObjectiveIsWrong) {
  REQUIRE_JAIL();
  auto r = score_python(
      "import gurobipy as gp\nm = gp.Model()\nx = m.addVar(ub=20)\n"
      "m.setObjective(2 * x, gp.GRB.MAXIMIZE)\nm.optimize()");
  EXPECT_EQ(r.status, "wrong") << r.message;
  EXPECT_DOUBLE_EQ(*r.predicted, 40.0);
}

TEST(EvalStatuses, SyntaxErrorIsError) {
  REQUIRE_JAIL();
  auto r = score_python("import gurobipy as gp\nm = gp.Model(\nx = = 3\n");
  EXPECT_EQ(r.status, "error");
  EXPECT_NE(r.message.find("SyntaxError"), std::string::npos) << r.message;
}

TEST(EvalStatuses, InfeasibleAndUnboundedModels) {
  REQUIRE_JAIL();
  auto r = score_python(
      "import gurobipy as gp\nm = gp.Model()\nx = m.addVar(ub=5)\nm.addConstr(x >= 6)\n"
      "m.setObjective(x)\nm.optimize()");
  EXPECT_EQ(r.status, "infeasible") << r.message;
  auto u = score_python(
      "import gurobipy as gp\nm = gp.Model()\nx = m.addVar()\nm.setObjective(x, gp.GRB.MAXIMIZE)\n"
      "m.optimize()");
  EXPECT_TRUE(u.status == "unbounded" || u.status == "infeasible") << u.status << " " << u.message;
}

TEST(EvalStatuses, InfiniteLoopTimesOut) {
  REQUIRE_JAIL();
  auto r = score_python("while True:\n    pass", 2.0);
  EXPECT_EQ(r.status, "timeout");
}

TEST(EvalStatuses, RunawayMemoryIsAnError) {
  REQUIRE_JAIL();
  auto r = score_python("blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))", 20.0);
  EXPECT_EQ(r.status, "error");
  EXPECT_NE(r.message.find("MemoryError"), std::string::npos) << r.message;
}

TEST(EvalStatuses, NetworkAccessFails) {
  REQUIRE_JAIL();
  auto r =
      score_python("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/', timeout=2)", 10.0);
  EXPECT_EQ(r.status, "error");
  auto s = score_python("import socket\ns = socket.socket()\ns.connect(('93.184.216.34', 80))", 10.0);
  EXPECT_EQ(s.status, "error");
  EXPECT_NE(s.message.find("unreachable"), std::string::npos) << s.message;
}

TEST(EvalStatuses, WritesOutsideTheDirectoryStayInTheJail) {
  REQUIRE_JAIL();
  const fs::path target = fs::temp_directory_path() / ("trex_escape_" + std::to_string(getpid()) + ".txt");
  // /tmp inside is the jail's own tmpfs: the write succeeds there and the program goes on
  auto r = score_python("open('" + target.string() +
                        "', 'w').write('x')\nimport gurobipy as gp\nm = gp.Model()\n"
                        "x = m.addVar(ub=20)\nm.setObjective(3 * x, gp.GRB.MAXIMIZE)\nm.optimize()");
  EXPECT_EQ(r.status, "correct") << r.message;
  EXPECT_FALSE(fs::exists(target));
  fs::remove(target);
}

TEST(EvalStatuses, HugePrintIsAnError) {
  REQUIRE_JAIL();
  auto r = score_python("while True:\n    print('x' * 1000)", 20.0);
  EXPECT_EQ(r.status, "error");
  EXPECT_EQ(r.detail, "crashed");
}

TEST(EvalStatuses, NoCodeAndNoModel) {
  REQUIRE_JAIL();
  const std::string text = "The optimum is 60.";
  auto r = score_item(item(60.0), &text, Rule::Relative, exec_config(5.0), 0);
  EXPECT_EQ(r.status, "no_code");
  auto n = score_python("x = 1 + 1\nprint(x)");
  EXPECT_EQ(n.status, "error");
  EXPECT_EQ(n.detail, "no_model");
}
