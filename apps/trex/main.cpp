// trex: one CLI, subcommands registered by the apps/trex/cmd_*.cpp files.
#include <algorithm>
#include <cstdio>

#include "command.h"
#include "core/error.h"
#include "core/log.h"

namespace trex::cli {

static std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
bool register_command(Command command) {
  registry().push_back(std::move(command));
  return true;
}
const std::vector<Command>& commands() { return registry(); }

}  // namespace trex::cli

int main(int argc, char** argv) {
  CLI::App app{"T-Rex: full-parameter post-training of DeepSeek-V4 models, and the OR data and evaluation around it"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "trex 0.1.0");
  std::string level = "info";
  app.add_option("--log-level", level, "trace, debug, info, warn, error, off")->capture_default_str();
  auto cmds = trex::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    c.setup(*sub);
  }
  app.parse_complete_callback([&] { trex::log::init(level); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const trex::cli::Exit& e) {
    return e.code;
  } catch (const trex::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
