#include "model/dsv4/recompute.h"

#include "core/error.h"

namespace trex::dsv4 {

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::None:
      return "none";
    case Recompute::Selective:
      return "selective";
    case Recompute::Full:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& s, const std::string& what) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  fail("{}: recompute '{}' (expected none, selective or full)", what, s);
}

}  // namespace trex::dsv4
