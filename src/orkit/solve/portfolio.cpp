#include "orkit/solve/portfolio.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "core/error.h"
#include "orkit/solve/backends.h"

namespace trex::orkit::detail {

namespace {

// The wire format child -> parent: status, objective, values, solver name, message.
void put_bytes(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
void put_u64(std::string& out, uint64_t v) { put_bytes(out, &v, sizeof v); }

std::string encode(const SolveResult& r) {
  std::string out;
  put_u64(out, static_cast<uint64_t>(r.status));
  put_bytes(out, &r.objective, sizeof r.objective);
  put_u64(out, r.values.size());
  put_bytes(out, r.values.data(), r.values.size() * sizeof(double));
  put_u64(out, r.solver.size());
  out += r.solver;
  put_u64(out, r.message.size());
  out += r.message;
  return out;
}

bool decode(const std::string& in, size_t n_vars, SolveResult& r) {
  size_t at = 0;
  auto get = [&](void* p, size_t n) {
    if (in.size() - at < n) return false;
    std::memcpy(p, in.data() + at, n);
    at += n;
    return true;
  };
  uint64_t status = 0, nv = 0, ns = 0, nm = 0;
  if (!get(&status, 8) || status > static_cast<uint64_t>(SolveStatus::Error) || !get(&r.objective, 8) ||
      !get(&nv, 8) || (nv != 0 && nv != n_vars))
    return false;
  r.status = static_cast<SolveStatus>(status);
  r.values.resize(nv);
  if (!get(r.values.data(), nv * sizeof(double)) || !get(&ns, 8) || ns > 64) return false;
  r.solver.resize(ns);
  if (!get(r.solver.data(), ns) || !get(&nm, 8) || nm > in.size()) return false;
  r.message.resize(nm);
  return get(r.message.data(), nm) && at == in.size();
}

bool write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += size_t(w);
  }
  return true;
}

SolveResult run_backend(SolverKind kind, const Model& model, const SolveOptions& o) {
  switch (kind) {
    case SolverKind::Cbc: return solve_cbc(model, o);
    case SolverKind::Glpk: return solve_glpk(model, o);
    default: break;
  }
  SolveResult r;
  r.solver = solver_name(kind);
  r.message = std::string(solver_name(kind)) + " cannot be raced in the integer portfolio";
  return r;
}

[[noreturn]] void child_main(int fd, SolverKind kind, const Model& model, const SolveOptions& o) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (!o.verbose) {
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) ::dup2(null_fd, 1), ::dup2(null_fd, 2), ::close(null_fd);
  }
  SolveResult r;
  try {
    r = run_backend(kind, model, o);
  } catch (const std::exception& e) {
    r.status = SolveStatus::Error;
    r.solver = solver_name(kind);
    r.message = e.what();
  } catch (...) {
    r.status = SolveStatus::Error;
    r.solver = solver_name(kind);
    r.message = "unknown exception";
  }
  _exit(write_all(fd, encode(r)) ? 0 : 3);
}

struct Racer {
  SolverKind kind;
  pid_t pid = -1;
  int fd = -1;
  std::string bytes;
  bool done = false;
  SolveResult result;
  double seconds = 0.0;
};

bool proven(SolveStatus s) {
  return s == SolveStatus::Optimal || s == SolveStatus::Infeasible || s == SolveStatus::Unbounded;
}

// Among unproven answers: a feasible point under a limit, then any limit, then infeasible-or-unbounded,
// then errors.
int rank(const SolveResult& r) {
  if (r.status == SolveStatus::Limit) return r.values.empty() ? 2 : 3;
  if (r.status == SolveStatus::InfeasibleOrUnbounded) return 1;
  return 0;
}

void stop(Racer& r) {
  if (r.pid > 0) {
    ::kill(r.pid, SIGKILL);
    while (::waitpid(r.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    r.pid = -1;
  }
  if (r.fd >= 0) ::close(r.fd), r.fd = -1;
}

}  // namespace

bool uses_portfolio(const Model& model, const SolveOptions& options) {
  return options.solver == SolverKind::Auto && options.portfolio && model.has_integers() && !model.is_quadratic() &&
         solver_available(SolverKind::Cbc) && solver_available(SolverKind::Glpk);
}

SolveResult solve_portfolio(const Model& model, const SolveOptions& options, const std::vector<SolverKind>& solvers) {
  TREX_CHECK(!solvers.empty(), "portfolio: no solver to race");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Racer> racers;
  for (SolverKind k : solvers) racers.push_back(Racer{k});
  std::fflush(nullptr);  // nothing buffered is duplicated into the children
  for (Racer& r : racers) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      for (Racer& s : racers) stop(s);
      fail("portfolio: pipe: {}", std::strerror(errno));
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      ::close(p[0]), ::close(p[1]);
      for (Racer& s : racers) stop(s);
      fail("portfolio: fork: {}", std::strerror(errno));
    }
    if (pid == 0) {
      ::close(p[0]);
      child_main(p[1], r.kind, model, options);
    }
    ::close(p[1]);
    r.pid = pid;
    r.fd = p[0];
  }
  const double deadline = options.time_limit_s > 0 ? options.time_limit_s + 1.0 : -1.0;
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  Racer* winner = nullptr;
  size_t open = racers.size();
  bool timed_out = false;
  while (open > 0 && !winner) {
    std::vector<pollfd> fds;
    std::vector<Racer*> who;
    for (Racer& r : racers)
      if (!r.done) fds.push_back({r.fd, POLLIN, 0}), who.push_back(&r);
    int wait_ms = -1;
    if (deadline > 0) {
      const double left = deadline - elapsed();
      if (left <= 0) {
        timed_out = true;
        break;
      }
      wait_ms = int(left * 1000.0) + 1;
    }
    const int n = ::poll(fds.data(), fds.size(), wait_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Racer& r = *who[i];
      char buf[65536];
      const ssize_t got = ::read(r.fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got > 0) {
        r.bytes.append(buf, size_t(got));
        continue;
      }
      // EOF: the child finished (or died).
      r.done = true;
      --open;
      r.seconds = elapsed();
      int wstatus = 0;
      while (::waitpid(r.pid, &wstatus, 0) < 0 && errno == EINTR) {
      }
      r.pid = -1;
      ::close(r.fd), r.fd = -1;
      if (!(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) || !decode(r.bytes, model.vars.size(), r.result)) {
        r.result = SolveResult{};
        r.result.solver = solver_name(r.kind);
        r.result.message = WIFSIGNALED(wstatus)
                               ? fmt::format("{} died (signal {})", solver_name(r.kind), WTERMSIG(wstatus))
                               : fmt::format("{} ended without a result", solver_name(r.kind));
      }
      if (proven(r.result.status) && !winner) winner = &r;
    }
  }
  for (Racer& r : racers) stop(r);  // the losers (and, after a time-out, everyone)
  SolveResult out;
  std::string race;
  if (winner) {
    out = winner->result;
    race = fmt::format("portfolio: {} proved it first in {:.3f} s", solver_name(winner->kind), winner->seconds);
    for (const Racer& r : racers)
      if (&r != winner)
        race += r.done ? fmt::format("; {} had finished ({})", solver_name(r.kind), r.result.message.empty()
                                                                                          ? "unproven"
                                                                                          : r.result.message)
                       : fmt::format("; {} stopped", solver_name(r.kind));
  } else {
    const Racer* best = nullptr;
    for (const Racer& r : racers)
      if (r.done && (!best || rank(r.result) > rank(best->result))) best = &r;
    if (best) {
      out = best->result;
    } else {
      out.status = SolveStatus::Limit;
      out.solver = solver_name(racers.front().kind);
      out.message = fmt::format("no solver finished within the time limit ({} s)", options.time_limit_s);
    }
    race = "portfolio: no solver proved an answer";
    for (const Racer& r : racers)
      race += fmt::format("; {}: {}", solver_name(r.kind),
                          r.done ? (r.result.message.empty() ? "unproven" : r.result.message)
                                 : (timed_out ? "killed at the time limit" : "stopped"));
  }
  out.message = out.message.empty() ? race : out.message + " (" + race + ")";
  return out;
}

}  // namespace trex::orkit::detail
