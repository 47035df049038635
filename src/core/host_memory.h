// What this machine's host memory holds for a new allocation: /proc/meminfo's MemAvailable (the kernel's estimate
// of memory available without swapping, page cache it can drop included), so a job can refuse before it builds
// something the host cannot hold instead of being killed half-way.
#pragma once
#include <cstdint>
#include <string>

namespace trex {

// Bytes available, or -1 where /proc/meminfo has no MemAvailable line (not Linux).
int64_t host_available_bytes();
// The host's name (gethostname), "" when unknown: ranks on one host share its memory.
std::string host_name();

}  // namespace trex
