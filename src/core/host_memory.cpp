#include "core/host_memory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

namespace trex {

int64_t host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream s(line.substr(13));
    int64_t kib = -1;
    s >> kib;
    return kib < 0 ? -1 : kib * 1024;
  }
  return -1;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

}  // namespace trex
