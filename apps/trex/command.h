// Subcommand registry: each apps/trex/cmd_*.cpp registers its subcommands with
//   static const bool registered = trex::cli::register_command({"name", "help", setup});
// where setup(CLI::App& sub) adds options and sets sub.callback(...). A callback signals failure by
// throwing trex::Error (printed as "error: ...", exit 1) or by calling trex::cli::exit_with(code).
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace trex::cli {

struct Command {
  std::string name;
  std::string help;
  std::function<void(CLI::App&)> setup;
};

bool register_command(Command command);
const std::vector<Command>& commands();

// Thrown to end the program with a specific exit code after output was already printed.
struct Exit {
  int code;
};
[[noreturn]] inline void exit_with(int code) { throw Exit{code}; }

}  // namespace trex::cli
