#include "orkit/eval/sandbox.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
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

namespace fs = std::filesystem;

namespace {

// Sizes of what the parent reads back from a child.
constexpr size_t kStatusBytes = 4096;

void set_limit(int resource, rlim_t soft, rlim_t hard) {
  struct rlimit rl {
    soft, hard
  };
  setrlimit(resource, &rl);
}

void chown_tree(const fs::path& dir, long uid) {
  std::error_code ec;
  if (lchown(dir.c_str(), uid_t(uid), gid_t(uid)) != 0) return;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    (void)!lchown(it->path().c_str(), uid_t(uid), gid_t(uid));
}

std::string find_on_path(const char* name) {
  for (const char* dir : {"/usr/bin", "/bin", "/usr/local/bin"}) {
    const fs::path p = fs::path(dir) / name;
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    for (size_t pos = 0; pos <= p.size();) {
      size_t end = p.find(':', pos);
      if (end == std::string::npos) end = p.size();
      const fs::path cand = fs::path(p.substr(pos, end - pos)) / name;
      if (!p.substr(pos, end - pos).empty() && access(cand.c_str(), X_OK) == 0) return cand.string();
      pos = end + 1;
    }
  }
  return {};
}

// An O_PATH descriptor the jail binds from: bwrap then needs no access to the path's parents, which matters
// when the harness is root and the jail runs under a slot uid.
struct PathFd {
  int fd = -1;
  PathFd() = default;
  explicit PathFd(const fs::path& p) {
    fd = open(p.c_str(), O_PATH | O_CLOEXEC);
    TREX_CHECK(fd >= 0, "sandbox: cannot open {} for the jail: {}", p.string(), strerror(errno));
  }
  PathFd(const PathFd&) = delete;
  PathFd& operator=(const PathFd&) = delete;
  PathFd(PathFd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  PathFd& operator=(PathFd&& o) noexcept {
    if (this != &o) {
      if (fd >= 0) close(fd);
      fd = o.fd;
      o.fd = -1;
    }
    return *this;
  }
  ~PathFd() {
    if (fd >= 0) close(fd);
  }
};

// The bwrap command line (before "--"): namespaces, the read-only system view, the caller's views, the
// work directory, /proc, /dev, /tmp. `fds` receives the descriptors the child must keep open.
std::vector<std::string> jail_args(const JailSupport& js, const SandboxJob& job, const SandboxLimits& lim,
                                   const std::vector<PathFd>& view_fds, const PathFd& work_fd, int status_fd) {
  std::vector<std::string> a{js.bwrap,         "--unshare-all", "--unshare-user", "--disable-userns",
                             "--die-with-parent", "--new-session", "--uid",         "1000",
                             "--gid",          "1000",          "--hostname",     "trex-jail",
                             "--ro-bind",      "/usr",          "/usr"};
  // Merged-/usr systems have /bin -> usr/bin etc.; others get a read-only view of the real directory.
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"}) {
    std::error_code ec;
    const auto st = fs::symlink_status(top, ec);
    if (ec || !fs::exists(st)) continue;
    if (fs::is_symlink(st)) {
      a.insert(a.end(), {"--symlink", fs::read_symlink(top, ec).string(), top});
    } else if (fs::is_directory(st)) {
      a.insert(a.end(), {"--ro-bind", top, top});
    }
  }
  a.insert(a.end(), {"--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--ro-bind-try",
                     "/etc/alternatives", "/etc/alternatives"});
  a.insert(a.end(), {"--proc", "/proc", "--dev", "/dev", "--size", std::to_string(lim.tmp_bytes), "--tmpfs",
                     "/tmp"});
  for (size_t i = 0; i < job.views.size(); ++i)
    a.insert(a.end(), {"--ro-bind-fd", std::to_string(view_fds[i].fd), job.views[i].inside});
  a.insert(a.end(), {job.workdir_writable ? "--bind-fd" : "--ro-bind-fd", std::to_string(work_fd.fd),
                     kJailWorkdir, "--chdir", kJailWorkdir, "--json-status-fd", std::to_string(status_fd)});
  // The process limit is set inside the new user namespace, where it counts only this jail's processes.
  a.insert(a.end(), {"--", "/usr/bin/prlimit",
                     fmt::format("--nproc={}:{}", lim.max_processes, lim.max_processes), "--"});
  return a;
}

SandboxResult run_job(const SandboxJob& job, const SandboxLimits& limits, const JailSupport& js);

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

long jail_host_uid(int slot) {
  TREX_CHECK(slot >= 0 && slot < kJailUidCount, "sandbox: job slot {} out of range [0, {})", slot,
             kJailUidCount);
  return kJailUidBase + slot;
}

const JailSupport& jail_support() {
  static std::once_flag once;
  static JailSupport js;
  std::call_once(once, [] {
    const char* fix_unsafe =
        " Or pass --unsafe-no-sandbox to run the programs unisolated: they can then read and write everything "
        "this user can, reach the network and read the answer key, so the scores are only as trustworthy as "
        "the answers.";
    js.bwrap = find_on_path("bwrap");
    if (js.bwrap.empty()) {
      js.problem = std::string("bubblewrap (bwrap) is not installed: the evaluator runs every program in a bwrap "
                               "jail. Install it (Debian: apt-get install bubblewrap; scripts/setup.sh does).") +
                   fix_unsafe;
      return;
    }
    if (access("/usr/bin/prlimit", X_OK) != 0) {
      js.problem = std::string("/usr/bin/prlimit (util-linux) is missing: the jail sets its process limit with "
                               "it. Install util-linux.") +
                   fix_unsafe;
      return;
    }
    js.ok = true;  // provisionally, so that the trial below runs in the jail
    std::string tmpl = (fs::temp_directory_path() / "trex-jail-check-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      js.ok = false;
      js.problem = fmt::format("cannot create a directory under {} to check the jail: {}",
                               fs::temp_directory_path().string(), strerror(errno));
      return;
    }
    SandboxJob job;
    job.argv = {"/usr/bin/true"};
    job.env = {"PATH=/usr/bin:/bin"};
    job.workdir = tmpl;
    SandboxLimits lim;
    lim.wall_seconds = 30;
    lim.memory_bytes = size_t(1) << 30;
    SandboxResult r;
    try {
      r = run_job(job, lim, js);
    } catch (const std::exception& e) {
      r.output = e.what();
    }
    std::error_code ec;
    fs::remove_all(tmpl, ec);
    if (r.end != SandboxEnd::Exited || r.exit_code != 0) {
      js.ok = false;
      std::string why = r.output;
      while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
      js.problem = fmt::format(
          "bwrap ({}) cannot build a jail here ({}{}{}). It needs user namespaces that an unprivileged user may "
          "create: `sysctl user.max_user_namespaces` must be > 0, `kernel.unprivileged_userns_clone` 1 where it "
          "exists, `kernel.apparmor_restrict_unprivileged_userns` 0 where it exists (Ubuntu), and a container "
          "must allow namespaces (Docker: --security-opt seccomp=unconfined --security-opt apparmor=unconfined).",
          js.bwrap, r.describe(), why.empty() ? "" : ": ", why);
      js.problem += fix_unsafe;
    }
  });
  return js;
}

void require_jail() {
  const JailSupport& js = jail_support();
  TREX_CHECK(js.ok, "cannot isolate the graded programs: {}", js.problem);
}

std::optional<std::string> read_workdir_file(const fs::path& dir, const std::string& name, size_t max_bytes) {
  TREX_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
             "read_workdir_file: '{}' is not a plain file name", name);
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  TREX_CHECK(dfd >= 0, "cannot open the work directory {}: {}", dir.string(), strerror(errno));
  const int fd = openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  const int open_errno = errno;
  close(dfd);
  if (fd < 0) {
    if (open_errno == ENOENT) return std::nullopt;
    fail("{}/{}: cannot open: {}", dir.string(), name,
         open_errno == ELOOP ? "it is a symbolic link" : strerror(open_errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    fail("{}/{}: not a regular file", dir.string(), name);
  }
  if (size_t(st.st_size) > max_bytes) {
    close(fd);
    fail("{}/{}: {} bytes, more than the {} allowed", dir.string(), name, size_t(st.st_size), max_bytes);
  }
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, size_t(n));
    if (text.size() > max_bytes) {
      close(fd);
      fail("{}/{}: more than the {} bytes allowed", dir.string(), name, max_bytes);
    }
  }
  close(fd);
  return text;
}

SandboxResult run_sandboxed(const SandboxJob& job, const SandboxLimits& limits) {
  TREX_CHECK(!job.argv.empty(), "sandbox: empty command");
  if (job.isolation == Isolation::Jail) require_jail();
  return run_job(job, limits, jail_support());
}

namespace {

SandboxResult run_job(const SandboxJob& job, const SandboxLimits& limits, const JailSupport& js) {
  SandboxResult res;
  const bool jailed = job.isolation == Isolation::Jail;
  const bool root = geteuid() == 0;
  const long uid = jailed && root ? jail_host_uid(job.slot) : -1;
  if (uid >= 0) chown_tree(job.workdir, uid);

  std::vector<PathFd> view_fds;
  PathFd work_fd;
  int status_pipe[2] = {-1, -1};
  std::vector<std::string> argv;
  if (jailed) {
    for (const JailView& v : job.views) {
      TREX_CHECK(!v.inside.empty() && v.inside[0] == '/', "sandbox: jail path '{}' is not absolute", v.inside);
      view_fds.emplace_back(v.host);
    }
    work_fd = PathFd(job.workdir);
    TREX_CHECK(pipe2(status_pipe, O_CLOEXEC) == 0, "sandbox: pipe failed: {}", strerror(errno));
    argv = jail_args(js, job, limits, view_fds, work_fd, status_pipe[1]);
  }
  argv.insert(argv.end(), job.argv.begin(), job.argv.end());
  std::vector<int> keep_fds;
  for (const PathFd& f : view_fds) keep_fds.push_back(f.fd);
  if (jailed) keep_fds.push_back(work_fd.fd), keep_fds.push_back(status_pipe[1]);

  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : job.env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  const std::string dir = job.workdir.string();
  const double cpu = limits.cpu_seconds > 0 ? limits.cpu_seconds : limits.wall_seconds + 5.0;
  const pid_t harness = getpid();

  int out_pipe[2], info_pipe[2];
  TREX_CHECK(pipe2(out_pipe, O_CLOEXEC) == 0 && pipe2(info_pipe, O_CLOEXEC) == 0, "sandbox: pipe failed: {}",
             strerror(errno));
  auto close_status = [&] {
    for (int& fd : status_pipe)
      if (fd >= 0) close(fd), fd = -1;
  };
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid < 0) {
    close(out_pipe[0]), close(out_pipe[1]), close(info_pipe[0]), close(info_pipe[1]);
    close_status();
    res.output = fmt::format("fork failed: {}", strerror(errno));
    return res;
  }
  if (pid == 0) {
    // Child: only async-signal-safe system calls from here to exec. A failure reports errno and a step.
    auto die = [&](int step) {
      int msg[2] = {step, errno};
      (void)!write(info_pipe[1], msg, sizeof msg);
      _exit(127);
    };
    setsid();
    set_limit(RLIMIT_CPU, rlim_t(cpu), rlim_t(cpu) + 2);
    set_limit(RLIMIT_AS, limits.memory_bytes, limits.memory_bytes);
    set_limit(RLIMIT_FSIZE, limits.max_file_bytes, limits.max_file_bytes);
    set_limit(RLIMIT_NOFILE, limits.max_open_files, limits.max_open_files);
    set_limit(RLIMIT_CORE, 0, 0);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(out_pipe[1], 2);
    if (!jailed && chdir(dir.c_str()) != 0) die(1);
    if (uid >= 0) {
      if (setgroups(0, nullptr) != 0 || setresgid(gid_t(uid), gid_t(uid), gid_t(uid)) != 0 ||
          setresuid(uid_t(uid), uid_t(uid), uid_t(uid)) != 0)
        die(2);
    }
    // Dies with the harness thread that started it (set after the uid change, which clears it).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != harness) _exit(127);
    syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */);
    for (int fd : keep_fds) fcntl(fd, F_SETFD, 0);
    execve(cargv[0], cargv.data(), cenv.data());
    die(3);
  }
  close(out_pipe[1]);
  close(info_pipe[1]);
  if (status_pipe[1] >= 0) close(status_pipe[1]), status_pipe[1] = -1;
  work_fd = PathFd();
  view_fds.clear();
  int child_error[2] = {0, 0};
  {
    ssize_t n;
    while ((n = read(info_pipe[0], child_error, sizeof child_error)) < 0 && errno == EINTR) {
    }
    if (n != ssize_t(sizeof child_error)) child_error[0] = 0;
    close(info_pipe[0]);
  }
  res.jailed = jailed;
  res.host_uid = uid;

  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  // The jail's init has PR_SET_PDEATHSIG from bwrap (--die-with-parent): killing bwrap kills the init and
  // with it every process of the PID namespace. Without a jail the process group is all we can reach.
  auto kill_all = [&] {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
  };
  bool exited = false, killed_wall = false, killed_output = false, pipe_open = true;
  int status = 0;
  size_t total = 0;
  char buf[65536];
  while (true) {
    if (!exited) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) {
        exited = true;
        if (!jailed) kill(-pid, SIGKILL);  // what it left behind in its group goes too
      }
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
        pipe_open = false;  // nothing more buffered; everything it started is gone
      }
    }
    if (exited && !pipe_open) break;
    if (!exited && !killed_wall && elapsed() > limits.wall_seconds) {
      killed_wall = true;
      kill_all();
    }
  }
  close(out_pipe[0]);
  std::string status_text;
  if (status_pipe[0] >= 0) {
    fcntl(status_pipe[0], F_SETFL, O_NONBLOCK);
    ssize_t n;
    while (status_text.size() < kStatusBytes && (n = read(status_pipe[0], buf, sizeof buf)) > 0)
      status_text.append(buf, size_t(n));
  }
  close_status();
  res.seconds = elapsed();
  if (child_error[0] != 0) {
    static const char* steps[] = {"", "enter the work directory", "switch to the job's uid", "execute"};
    res.end = SandboxEnd::StartFailed;
    res.output = fmt::format("cannot {} ({}): {}", steps[child_error[0]],
                             child_error[0] == 3 ? argv[0] : child_error[0] == 2 ? std::to_string(uid) : dir,
                             strerror(child_error[1]));
    return res;
  }
  if (killed_output) {
    res.end = SandboxEnd::OutputLimit;
    return res;
  }
  if (killed_wall) {
    res.end = SandboxEnd::WallTimeout;
    return res;
  }
  if (jailed && status_text.find("\"child-pid\"") == std::string::npos && !WIFSIGNALED(status)) {
    res.end = SandboxEnd::StartFailed;  // bwrap could not set up the jail; its message is the output
    return res;
  }
  int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  // bwrap reports a command killed by a signal as exit 128 + signal, like a shell.
  if (jailed && WIFEXITED(status) && WEXITSTATUS(status) > 128 && WEXITSTATUS(status) < 128 + 65)
    sig = WEXITSTATUS(status) - 128;
  if (sig != 0) {
    res.signal = sig;
    res.end = (sig == SIGXCPU) ? SandboxEnd::CpuTimeout : SandboxEnd::Signaled;
  } else {
    res.end = SandboxEnd::Exited;
    res.exit_code = WEXITSTATUS(status);
  }
  return res;
}

}  // namespace

}  // namespace trex::orkit::eval
