// Runs one untrusted command (a generated program, a solver on a generated LP file) in isolation:
// its own process group and session, a fresh working directory, rlimits on CPU time, address space,
// processes, file size and open files, a wall-clock limit that kills the whole group, captured output
// with a cap, and — when the process may (root) — no network (a fresh network namespace) and an
// unprivileged uid whose every process is killed afterwards, so even escaped children die.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

namespace trex::orkit::eval {

struct SandboxLimits {
  double wall_seconds = 60.0;
  double cpu_seconds = 0.0;               // 0: wall_seconds + 5
  size_t memory_bytes = size_t(4) << 30;  // RLIMIT_AS
  int max_processes = 64;                 // RLIMIT_NPROC (for the sandbox uid; threads count)
  size_t max_file_bytes = size_t(256) << 20;
  int max_open_files = 256;
  size_t max_output_bytes = size_t(1) << 20;  // stdout+stderr beyond this kills the run
  bool isolate_network = true;                // unshare(CLONE_NEWNET) when permitted
  int sandbox_uid = -1;                       // when root: run as this uid (-1: 61000 + slot)
  int slot = 0;                               // worker index, picks a distinct uid per worker
};

enum class SandboxEnd { Exited, Signaled, WallTimeout, CpuTimeout, OutputLimit, StartFailed };

struct SandboxResult {
  SandboxEnd end = SandboxEnd::StartFailed;
  int exit_code = -1;  // when Exited
  int signal = 0;      // when Signaled
  std::string output;  // stdout and stderr interleaved, at most max_output_bytes
  bool output_truncated = false;
  bool network_isolated = false;  // a fresh network namespace was in effect
  bool uid_dropped = false;
  double seconds = 0.0;
  std::string describe() const;  // "exit 0", "killed by signal 9", "wall-clock limit 5 s", ...
};

// argv[0] must be an absolute path or found on PATH. `env` is the complete environment ("K=V").
SandboxResult run_sandboxed(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                            const std::filesystem::path& workdir, const SandboxLimits& limits);

// True when this process can create network namespaces (checked once, by trying in a child).
bool network_isolation_available();

}  // namespace trex::orkit::eval
