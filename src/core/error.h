// Errors that say what was wrong and where. Every user-facing failure throws trex::Error with a
// message naming the file / line / tensor involved; the CLI prints it and exits non-zero.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace trex {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace trex

// TREX_CHECK(cond, "format", args...): throws trex::Error with the message when cond is false.
#define TREX_CHECK(cond, ...)                 \
  do {                                        \
    if (!(cond)) ::trex::fail(__VA_ARGS__);   \
  } while (0)

// Internal invariant (a bug if it fires, not a user error): names the source location.
#define TREX_ASSERT(cond)                                                                    \
  do {                                                                                       \
    if (!(cond)) ::trex::fail("internal error: {} failed at {}:{}", #cond, __FILE__, __LINE__); \
  } while (0)
