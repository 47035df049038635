#include "orkit/eval/sandbox.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace trex::orkit::eval {

namespace {

constexpr unsigned char kFlagNetns = 1, kFlagUid = 2;

void set_limit(int resource, rlim_t soft, rlim_t hard) {
  struct rlimit rl {
    soft, hard
  };
  setrlimit(resource, &rl);
}

// Kills every process of `uid` from a helper that takes that uid (kill(-1) then reaches exactly them).
void kill_uid(int uid) {
  pid_t helper = fork();
  if (helper == 0) {
    if (setgid(uid) != 0 || setuid(uid) != 0) _exit(1);
    kill(-1, SIGKILL);
    _exit(0);
  }
  if (helper > 0) waitpid(helper, nullptr, 0);
}

void chown_tree(const std::filesystem::path& dir, int uid) {
  std::error_code ec;
  lchown(dir.c_str(), uid, uid);
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    lchown(it->path().c_str(), uid, uid);
}

}  // namespace

std::string SandboxResult::describe() const {
  switch (end) {
    case SandboxEnd::Exited:
      return fmt::format("exit {}", exit_code);
    case SandboxEnd::Signaled:
      return fmt::format("killed by signal {} ({})", signal, strsignal(signal));
    case SandboxEnd::WallTimeout:
      return fmt::format("wall-clock limit reached after {:.1f} s", seconds);
    case SandboxEnd::CpuTimeout:
      return "CPU-time limit reached";
    case SandboxEnd::OutputLimit:
      return "output limit reached (program printed too much)";
    case SandboxEnd::StartFailed:
      return "could not start: " + output;
  }
  return "?";
}

bool network_isolation_available() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    pid_t pid = fork();
    if (pid == 0) _exit(unshare(CLONE_NEWNET) == 0 ? 0 : 1);
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, 0) == pid) ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  });
  return ok;
}

SandboxResult run_sandboxed(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                            const std::filesystem::path& workdir, const SandboxLimits& limits) {
  TREX_CHECK(!argv.empty(), "sandbox: empty command");
  SandboxResult res;
  const bool root = geteuid() == 0;
  const int uid = !root ? -1
                        : (limits.sandbox_uid >= 0 ? limits.sandbox_uid
                                                   : 200000 + (getpid() % 20000) * 64 + limits.slot % 64);
  const bool want_netns = limits.isolate_network && root && network_isolation_available();
  if (uid >= 0) chown_tree(workdir, uid);

  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const std::string dir = workdir.string();
  const double cpu = limits.cpu_seconds > 0 ? limits.cpu_seconds : limits.wall_seconds + 5.0;

  int out_pipe[2], info_pipe[2];
  TREX_CHECK(pipe2(out_pipe, O_CLOEXEC) == 0 && pipe2(info_pipe, O_CLOEXEC) == 0, "sandbox: pipe failed: {}",
             strerror(errno));
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) {
    close(out_pipe[0]), close(out_pipe[1]), close(info_pipe[0]), close(info_pipe[1]);
    res.output = fmt::format("fork failed: {}", strerror(errno));
    return res;
  }
  if (pid == 0) {
    // Child: only async-signal-safe system calls from here to exec.
    setsid();
    unsigned char flags = 0;
    if (want_netns && unshare(CLONE_NEWNET) == 0) flags |= kFlagNetns;
    set_limit(RLIMIT_CPU, rlim_t(cpu), rlim_t(cpu) + 2);
    set_limit(RLIMIT_AS, limits.memory_bytes, limits.memory_bytes);
    set_limit(RLIMIT_FSIZE, limits.max_file_bytes, limits.max_file_bytes);
    set_limit(RLIMIT_NOFILE, limits.max_open_files, limits.max_open_files);
    set_limit(RLIMIT_CORE, 0, 0);
    set_limit(RLIMIT_NPROC, limits.max_processes, limits.max_processes);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(out_pipe[1], 2);
    if (chdir(dir.c_str()) != 0) {
      int e = errno;
      (void)!write(info_pipe[1], &flags, 1);
      (void)!write(info_pipe[1], &e, sizeof e);
      _exit(127);
    }
    if (uid >= 0) {
      gid_t g = uid;
      if (setgroups(1, &g) == 0 && setgid(uid) == 0 && setuid(uid) == 0) flags |= kFlagUid;
    }
    syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
    (void)!write(info_pipe[1], &flags, 1);
    execvpe(cargv[0], cargv.data(), cenv.data());
    int e = errno;
    (void)!write(info_pipe[1], &e, sizeof e);
    _exit(127);
  }
  close(out_pipe[1]);
  close(info_pipe[1]);
  unsigned char flags = 0;
  int exec_errno = 0;
  {
    ssize_t n;
    while ((n = read(info_pipe[0], &flags, 1)) < 0 && errno == EINTR) {
    }
    if (n == 1) {
      while ((n = read(info_pipe[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
      }
      if (n != sizeof exec_errno) exec_errno = 0;
    }
    close(info_pipe[0]);
  }
  res.network_isolated = flags & kFlagNetns;
  res.uid_dropped = flags & kFlagUid;

  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  auto kill_all = [&] {
    kill(-pid, SIGKILL);
    if (res.uid_dropped) kill_uid(uid);
  };
  bool cleaned = false, exited = false, killed_wall = false, killed_output = false, pipe_open = true;
  int status = 0;
  size_t total = 0;
  char buf[65536];
  while (true) {
    if (!exited) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) exited = true;
    }
    if (exited && !cleaned) {
      // The program is gone; anything it left behind in its group (or under its uid) goes too.
      cleaned = true;
      kill_all();
    }
    if (pipe_open) {
      struct pollfd pfd {
        out_pipe[0], POLLIN, 0
      };
      int pr = poll(&pfd, 1, exited ? 0 : 20);
      if (pr > 0) {
        ssize_t n = read(out_pipe[0], buf, sizeof buf);
        if (n > 0) {
          total += size_t(n);
          if (res.output.size() < limits.max_output_bytes)
            res.output.append(buf, std::min<size_t>(size_t(n), limits.max_output_bytes - res.output.size()));
          if (total > limits.max_output_bytes && !killed_output && !exited) {
            killed_output = true;
            res.output_truncated = true;
            kill_all();
          }
          continue;
        }
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) pipe_open = false;
      } else if (exited) {
        pipe_open = false;  // nothing more buffered; descendants were killed
      }
    }
    if (exited && !pipe_open) break;
    if (!exited && !killed_wall && elapsed() > limits.wall_seconds) {
      killed_wall = true;
      kill_all();
    }
  }
  close(out_pipe[0]);
  res.seconds = elapsed();
  if (exec_errno != 0) {
    res.end = SandboxEnd::StartFailed;
    res.output = fmt::format("cannot run {}: {}", argv[0], strerror(exec_errno));
    return res;
  }
  if (killed_output) {
    res.end = SandboxEnd::OutputLimit;
  } else if (killed_wall) {
    res.end = SandboxEnd::WallTimeout;
  } else if (WIFSIGNALED(status)) {
    res.signal = WTERMSIG(status);
    res.end = (res.signal == SIGXCPU) ? SandboxEnd::CpuTimeout : SandboxEnd::Signaled;
  } else {
    res.end = SandboxEnd::Exited;
    res.exit_code = WEXITSTATUS(status);
  }
  return res;
}

}  // namespace trex::orkit::eval
