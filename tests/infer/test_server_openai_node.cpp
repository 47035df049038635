// `trex serve` through the official OpenAI Node client (tests/infer/openai_client_test.cjs): every endpoint
// and field, streamed and not, over loopback. Needs node and the npm package `openai` in local/node
// (scripts/setup.sh installs both); skipped with a message when either is missing. The client's outputs
// are compared with the same requests sent here over raw HTTP.
#ifdef TREX_HAVE_HTTPLIB
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "core/files.h"
#include "server_test_util.h"

using namespace trex;
using json = nlohmann::json;

namespace {

namespace fs = std::filesystem;

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    *status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *status = pclose(p);
  return out;
}

TEST(ServerOpenAiNodeClient, EveryEndpointAndFieldStreamedAndNot) {
  int st = 0;
  const std::string node = run("command -v node 2>/dev/null", &st);
  if (st != 0 || node.empty()) GTEST_SKIP() << "node is not installed (scripts/setup.sh installs nodejs)";
  const fs::path modules = source_dir() / "local" / "node" / "node_modules";
  if (!fs::exists(modules / "openai" / "package.json"))
    GTEST_SKIP() << "the npm package openai is not in " << modules.string()
                 << " (scripts/setup.sh installs it; or: npm install --prefix local/node openai@4.95.0)";
  test::TinyServer s;
  const fs::path script = source_dir() / "tests" / "infer" / "openai_client_test.cjs";
  const std::string url = "http://127.0.0.1:" + std::to_string(s.port) + "/v1";
  const std::string out =
      run("timeout 120 node '" + script.string() + "' '" + modules.string() + "' '" + url + "' 2>&1", &st);
  ASSERT_EQ(st, 0) << out;
  const std::string last = out.substr(out.rfind('{'));
  const json r = json::parse(last.substr(0, last.find('\n')));
  // The client saw what raw HTTP sees.
  auto ids = [&](const std::string& path, const json& body, size_t choice = 0) {
    auto res = s.post(path, body);
    EXPECT_TRUE(res && res->status == 200);
    return res ? json::parse(res->body)["choices"][choice]["token_ids"] : json();
  };
  const json msgs = json::array({{{"role", "user"}, {"content", "minimise the total cost of each warehouse"}}});
  EXPECT_EQ(r["chat_greedy"], ids("/v1/chat/completions", {{"model", "tiny"}, {"messages", msgs}, {"max_tokens", 16},
                                                           {"temperature", 0}, {"ignore_eos", true}}));
  EXPECT_EQ(r["completion_greedy"], ids("/v1/completions", {{"prompt", "the demand of each customer"},
                                                           {"max_tokens", 6}, {"temperature", 0}}));
  EXPECT_EQ(r["completion_ids"], ids("/v1/completions", {{"prompt", {0, 17, 99, 23}}, {"max_tokens", 6},
                                                         {"temperature", 0}}));
  ASSERT_EQ(r["completion_n3"].size(), 3u);
  for (size_t j = 0; j < 3; ++j)  // choice j of n = 3 is the n = 1 request with seed + j
    EXPECT_EQ(r["completion_n3"][j],
              ids("/v1/completions", {{"prompt", "the demand of each customer"}, {"max_tokens", 5},
                                      {"temperature", 1.0}, {"seed", 99 + int(j)}}));
  ASSERT_EQ(r["chat_n2"].size(), 2u);
  std::printf("openai node client: %s\n", last.substr(0, last.find('\n')).c_str());
}

}  // namespace
#endif  // TREX_HAVE_HTTPLIB
