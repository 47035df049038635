// Runs one untrusted command (a generated program, a solver on a generated model file) in a jail built by
// bubblewrap (bwrap): its own user, mount, PID, IPC, UTS, network and cgroup namespaces; a read-only view of
// /usr (the interpreter and its libraries) and of the paths the caller names; a private writable working
// directory and a size-capped tmpfs /tmp; a private /proc and a minimal /dev; no network; no further user
// namespaces. Bounds: rlimits on CPU time, address space, file size and open files (set before bwrap starts,
// inherited by everything inside), on processes (set inside the namespace, so it counts only the jail's own
// processes), a cap on output, and a wall-clock limit that kills the whole namespace. Everything the program
// started dies with it: the namespace's init is killed when the program or the harness ends.
//
// When the harness runs as root each job slot first switches to a host uid of its own (kJailUidBase + slot),
// so two jobs never share an identity on the host either; the jail needs no root for any of it.
//
// Isolation::None runs the command as a plain child (own process group, rlimits, wall clock, output cap) with
// full access to what the harness can reach: only for trusted input (`--unsafe-no-sandbox`).
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace trex::orkit::eval {

struct SandboxLimits {
  double wall_seconds = 60.0;
  double cpu_seconds = 0.0;               // 0: wall_seconds + 5
  size_t memory_bytes = size_t(4) << 30;  // RLIMIT_AS of every process
  int max_processes = 64;                 // RLIMIT_NPROC inside the jail (threads count)
  size_t max_file_bytes = size_t(256) << 20;
  int max_open_files = 256;
  size_t max_output_bytes = size_t(1) << 20;  // stdout+stderr beyond this kills the run
  size_t tmp_bytes = size_t(64) << 20;        // size of the jail's tmpfs /tmp
};

enum class Isolation { Jail, None };

// A read-only view of a host path inside the jail.
struct JailView {
  std::filesystem::path host;
  std::string inside;  // absolute path in the jail
};

inline constexpr const char* kJailWorkdir = "/sandbox";  // the working directory as the program sees it
inline constexpr long kJailUidBase = 2000000000;          // host uid of slot s when root: base + s
inline constexpr long kJailUidCount = 100000000;          // slots available (uids stay below 2^31)

struct SandboxJob {
  std::vector<std::string> argv;      // argv[0] absolute; paths as the program sees them
  std::vector<std::string> env;       // the complete environment ("K=V")
  std::filesystem::path workdir;      // host directory: the program's working directory
  bool workdir_writable = true;
  std::vector<JailView> views;        // besides /usr; ignored with Isolation::None
  Isolation isolation = Isolation::Jail;
  int slot = 0;                       // job index; picks the host uid when root
};

enum class SandboxEnd { Exited, Signaled, WallTimeout, CpuTimeout, OutputLimit, StartFailed };

struct SandboxResult {
  SandboxEnd end = SandboxEnd::StartFailed;
  int exit_code = -1;  // when Exited
  int signal = 0;      // when Signaled
  std::string output;  // stdout and stderr interleaved, at most max_output_bytes
  bool output_truncated = false;
  bool jailed = false;
  long host_uid = -1;  // the uid the jail ran under on the host (root harness only)
  double seconds = 0.0;
  std::string describe() const;  // "exit 0", "killed by signal 9", "wall-clock limit 5 s", ...
};

SandboxResult run_sandboxed(const SandboxJob& job, const SandboxLimits& limits);

// Whether a jail can be built here (checked once per process by starting one); `problem` says what is
// missing and how to fix it.
struct JailSupport {
  bool ok = false;
  std::string bwrap;    // path of the bwrap binary
  std::string problem;  // when !ok
};
const JailSupport& jail_support();

// Throws a trex::Error naming the problem, its fix and `--unsafe-no-sandbox` when no jail can be built.
void require_jail();

// The host uid of a job slot when the harness is root (throws when slot is out of range).
long jail_host_uid(int slot);

// Reads the regular file `name` directly inside `dir` (no path separators, symbolic links refused, FIFOs
// and devices refused), at most `max_bytes`; nullopt when it does not exist. Throws trex::Error when it is
// not a regular file or is larger than max_bytes. The harness reads a program's outputs only this way.
std::optional<std::string> read_workdir_file(const std::filesystem::path& dir, const std::string& name,
                                             size_t max_bytes);

}  // namespace trex::orkit::eval
