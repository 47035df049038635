// `trex serve`: an OpenAI-compatible chat and text completion server over the CPU or GPU engine with continuous batching
// (src/infer/chat_server.h documents the endpoints and request fields).
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "command.h"
#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer.h"
#include "infer/chat_server.h"
#include "infer/engine.h"
#include "infer/model_loader.h"
#include "infer/scheduler.h"
#include "infer/speculative.h"

namespace {

namespace fs = std::filesystem;
using namespace trex;

struct ServeArgs {
  std::string model, config, tokenizer, host = "127.0.0.1", name, device = "cpu", speculative = "off";
  uint64_t seed = 0;
  int port = 8000;
  int64_t max_batch = 8, max_context = 0, max_queue = 256, prefill_chunk = 512, step_prompt_tokens = 0,
          default_max_tokens = 256;
  infer::ServerLimits limits;
};

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) {
  g_stop = 1;
}

void run(const ServeArgs& a) {
  TREX_CHECK(infer::http_server_available(),
             "trex serve: built without cpp-httplib (install libcpp-httplib-dev)");
  TREX_CHECK(a.max_batch >= 1, "--max-batch must be >= 1");
  std::unique_ptr<data::Tokenizer> tok;
  std::string tok_path = a.tokenizer;
  if (tok_path.empty() && !a.model.empty() && fs::exists(fs::path(a.model) / "tokenizer.json"))
    tok_path = (fs::path(a.model) / "tokenizer.json").string();
  if (!tok_path.empty()) tok = std::make_unique<data::Tokenizer>(data::Tokenizer::load(tok_path));
  TREX_CHECK(a.model.empty() != a.config.empty(), "give exactly one of --model DIR and --config FILE");
  TREX_CHECK(a.device == "cpu" || a.device == "cuda", "--device must be cpu or cuda, got '{}'", a.device);
  TREX_CHECK(a.config.empty() || a.device == "cuda", "--config (random weights) needs --device cuda");
  TREX_CHECK(a.speculative == "off" || a.speculative == "mtp", "--speculative must be off or mtp, got '{}'",
             a.speculative);
  const bool spec = a.speculative == "mtp";  // speculative decoding with the MTP layer (infer/speculative.h)
  TREX_CHECK(!spec || a.device == "cuda", "--speculative mtp needs --device cuda");
  std::unique_ptr<infer::Engine> engine;
  if (a.device == "cuda") {
#ifdef TREX_HAVE_CUDA
    infer::CudaEngineOptions eo;
    eo.slots = a.max_batch;
    eo.max_context = a.max_context;
    eo.seed = a.seed;
    if (!a.config.empty()) {
      engine = infer::make_cuda_engine(dsv4::load_model_config(a.config), nullptr, eo, spec);
    } else {
      std::unique_ptr<dsv4::Model<float>> cpu = infer::load_inference_model(a.model, /*with_mtp=*/spec);
      engine = infer::make_cuda_engine(cpu->config(), &cpu->params(), eo, spec);
    }
#else
    fail("--device cuda: this trex was built without CUDA (configure with -DTREX_CUDA=ON)");
#endif
  } else {
    std::shared_ptr<dsv4::Model<float>> model = infer::load_inference_model(a.model);
    engine = infer::make_cpu_engine(model, a.max_batch, a.max_context);
  }
  infer::SchedulerOptions so;
  so.max_queue = a.max_queue;
  so.prefill_chunk = a.prefill_chunk;
  so.step_prompt_tokens = a.step_prompt_tokens;
  infer::Scheduler sched(std::move(engine), so);
  infer::ServerOptions o;
  o.host = a.host;
  o.port = a.port;
  o.model_name = a.name.empty() ? fs::path(a.model.empty() ? a.config : a.model).stem().string() : a.name;
  if (o.model_name.empty()) o.model_name = "deepseek-v4";
  o.default_max_tokens = a.default_max_tokens;
  o.limits = a.limits;
  infer::ChatServer server(sched, tok.get(), o);
  const int port = server.bind();
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::thread watcher([&] {
    while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    server.stop();
  });
  std::printf("serving %s on http://%s:%d (engine %s, %lld slots, context %lld, tokenizer %s)\n",
              o.model_name.c_str(), a.host.c_str(), port, sched.engine().name().c_str(), (long long)a.max_batch,
              (long long)sched.engine().max_context(),
              tok ? tok_path.c_str() : "none: prompt_token_ids only");
  std::fflush(stdout);
  server.run();
  g_stop = 1;
  watcher.join();
  sched.stop();
  log::info("server stopped");
}

const bool registered = trex::cli::register_command(
    {"serve", "OpenAI-compatible chat and text completion server (CPU or GPU engine, continuous batching)",
     [](CLI::App& app) {
       auto a = std::make_shared<ServeArgs>();
       app.add_option("--model", a->model, "model directory (config.json + safetensors)");
       app.add_option("--config", a->config, "config.json only: random bf16 weights (benchmarks; --device cuda)");
       app.add_option("--seed", a->seed, "seed of the random weights (--config)")->capture_default_str();
       app.add_option("--device", a->device, "cpu (fp32 decoder) or cuda (bf16 GPU engine)")->capture_default_str();
       app.add_option("--speculative", a->speculative,
                      "off, or mtp: the checkpoint's MTP layer drafts one token per step, verified by the main "
                      "model (--device cuda; all-greedy steps only)")
           ->capture_default_str();
       app.add_option("--tokenizer", a->tokenizer, "tokenizer.json (default: the model directory's, if any)");
       app.add_option("--host", a->host, "address to listen on")->capture_default_str();
       app.add_option("--port", a->port, "port (0 = any free port; the chosen one is printed)")
           ->capture_default_str();
       app.add_option("--max-batch", a->max_batch, "sequences decoded together (slots)")
           ->capture_default_str();
       app.add_option("--max-context", a->max_context, "context limit (default: the config's max_position)");
       app.add_option("--max-queue", a->max_queue, "waiting requests before 503")->capture_default_str();
       app.add_option("--prefill-chunk", a->prefill_chunk, "prompt tokens per step per request")
           ->capture_default_str();
       app.add_option("--step-prompt-tokens", a->step_prompt_tokens,
                      "prompt tokens per step over all requests (0: no bound; a bound spreads a burst's prefill "
                      "over several steps, so its first requests start sooner)")
           ->capture_default_str();
       app.add_option("--default-max-tokens", a->default_max_tokens, "max_tokens when a request gives none")
           ->capture_default_str();
       app.add_option("--max-body-bytes", a->limits.max_body_bytes,
                      "request body limit, chunked bodies included (413 beyond)")
           ->capture_default_str();
       app.add_option("--max-connections", a->limits.max_connections,
                      "open HTTP connections at once (503 and closed beyond)")
           ->capture_default_str();
       app.add_option("--header-timeout", a->limits.header_timeout_s,
                      "seconds from accept (or the previous response) to the end of a request's headers")
           ->capture_default_str();
       app.add_option("--body-timeout", a->limits.body_timeout_s,
                      "seconds from the end of the headers to the end of the body")
           ->capture_default_str();
       app.add_option("--max-prompts", a->limits.max_prompts, "prompts in one /v1/completions request")
           ->capture_default_str();
       app.add_option("--name", a->name, "model id reported by /v1/models (default: the directory name)");
       app.callback([a] { run(*a); });
     }});

}  // namespace
