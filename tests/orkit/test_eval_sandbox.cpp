// trex eval: the sandbox (limits, kill of the whole group, network and file-system isolation) and the
// statuses that wrong programs get.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

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

SandboxResult sh(const std::string& script, SandboxLimits lim = {}) {
  Dir d;
  return run_sandboxed({"/bin/sh", "-c", script}, env(), d.p, lim);
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

}  // namespace

TEST(EvalSandbox, CapturesOutputAndExitCode) {
  auto r = sh("echo hello; echo err >&2; exit 3");
  EXPECT_EQ(r.end, SandboxEnd::Exited);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.output.find("hello"), std::string::npos);
  EXPECT_NE(r.output.find("err"), std::string::npos);
}

TEST(EvalSandbox, WallClockLimitKillsTheWholeGroup) {
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
  SandboxLimits lim;
  lim.wall_seconds = 20.0;
  auto t0 = std::chrono::steady_clock::now();
  auto r = sh("(sleep 30; echo late) & echo done", lim);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.end, SandboxEnd::Exited);
  EXPECT_LT(s, 10.0);  // did not wait for the orphan
  EXPECT_EQ(r.output.find("late"), std::string::npos);
}

TEST(EvalSandbox, OutputIsCapped) {
  SandboxLimits lim;
  lim.max_output_bytes = 64 << 10;
  lim.wall_seconds = 20.0;
  auto r = sh("yes trex", lim);
  EXPECT_EQ(r.end, SandboxEnd::OutputLimit);
  EXPECT_LE(r.output.size(), size_t(64 << 10));
}

TEST(EvalSandbox, ForkBombIsContained) {
  if (geteuid() != 0)
    GTEST_SKIP() << "RLIMIT_NPROC is per user: only contained when the sandbox can switch uid";
  SandboxLimits lim;
  lim.wall_seconds = 3.0;
  lim.max_processes = 32;
  auto t0 = std::chrono::steady_clock::now();
  auto r = sh("bomb() { bomb | bomb & }; bomb; sleep 100", lim);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(r.uid_dropped);
  EXPECT_LT(s, 15.0);
  EXPECT_NE(r.end, SandboxEnd::StartFailed);
}

TEST(EvalSandbox, NetworkNamespaceBlocksLoopbackOfTheHost) {
  if (!network_isolation_available()) GTEST_SKIP() << "cannot create network namespaces here";
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
  auto r = run_sandboxed({"/usr/bin/python3", "-c", py}, env(), d.p, lim);
  close(srv);
  EXPECT_TRUE(r.network_isolated);
  EXPECT_EQ(r.end, SandboxEnd::Exited);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.output.find("connected"), std::string::npos) << r.output;
}

TEST(EvalStatuses, CorrectProgramIsCorrect) {
  auto r = score_python(
      "import gurobipy as gp\nm = gp.Model()\nx = m.addVar(ub=20)\n"
      "m.setObjective(3 * x, gp.GRB.MAXIMIZE)\nm.optimize()");
  EXPECT_EQ(r.status, "correct") << r.message;
  ASSERT_TRUE(r.predicted.has_value());
  EXPECT_DOUBLE_EQ(*r.predicted, 60.0);
}

TEST(EvalStatuses, WrongObjectiveIsWrong) {
  auto r = score_python(
      "import gurobipy as gp\nm = gp.Model()\nx = m.addVar(ub=20)\n"
      "m.setObjective(2 * x, gp.GRB.MAXIMIZE)\nm.optimize()");
  EXPECT_EQ(r.status, "wrong") << r.message;
  EXPECT_DOUBLE_EQ(*r.predicted, 40.0);
}

TEST(EvalStatuses, SyntaxErrorIsError) {
  auto r = score_python("import gurobipy as gp\nm = gp.Model(\nx = = 3\n");
  EXPECT_EQ(r.status, "error");
  EXPECT_NE(r.message.find("SyntaxError"), std::string::npos) << r.message;
}

TEST(EvalStatuses, InfeasibleAndUnboundedModels) {
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
  auto r = score_python("while True:\n    pass", 2.0);
  EXPECT_EQ(r.status, "timeout");
}

TEST(EvalStatuses, RunawayMemoryIsAnError) {
  auto r = score_python("blocks = []\nwhile True:\n    blocks.append(bytearray(50 << 20))", 20.0);
  EXPECT_EQ(r.status, "error");
  EXPECT_NE(r.message.find("MemoryError"), std::string::npos) << r.message;
}

TEST(EvalStatuses, NetworkAccessFails) {
  auto r =
      score_python("import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9/', timeout=2)", 10.0);
  EXPECT_EQ(r.status, "error");
  auto s = score_python("import socket\ns = socket.socket()\ns.connect(('93.184.216.34', 80))", 10.0);
  EXPECT_EQ(s.status, "error");
  EXPECT_NE(s.message.find("network"), std::string::npos) << s.message;
}

TEST(EvalStatuses, WritingOutsideTheDirectoryFails) {
  const fs::path target = fs::temp_directory_path() / ("trex_escape_" + std::to_string(getpid()) + ".txt");
  auto r = score_python("open('" + target.string() +
                        "', 'w').write('x')\nimport gurobipy as gp\nm = gp.Model()\n"
                        "x = m.addVar(ub=20)\nm.setObjective(3 * x, gp.GRB.MAXIMIZE)\nm.optimize()");
  EXPECT_EQ(r.status, "error") << r.message;
  EXPECT_FALSE(fs::exists(target));
  fs::remove(target);
}

TEST(EvalStatuses, HugePrintIsAnError) {
  auto r = score_python("while True:\n    print('x' * 1000)", 20.0);
  EXPECT_EQ(r.status, "error");
  EXPECT_EQ(r.detail, "crashed");
}

TEST(EvalStatuses, NoCodeAndNoModel) {
  const std::string text = "The optimum is 60.";
  auto r = score_item(item(60.0), &text, Rule::Relative, exec_config(5.0), 0);
  EXPECT_EQ(r.status, "no_code");
  auto n = score_python("x = 1 + 1\nprint(x)");
  EXPECT_EQ(n.status, "error");
  EXPECT_EQ(n.detail, "no_model");
}
