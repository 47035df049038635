// `trex bench-serve`: an in-process load test of the serving stack. Client threads submit requests to the same
// Scheduler + Engine objects `trex serve` runs (continuous batching; each request's tokens are timestamped as the
// scheduler publishes them), without HTTP, so it also runs where the server's HTTP library is missing. Per
// concurrency level C: a prefill round (C requests of P random prompt tokens, max_tokens 1: prefill tok/s =
// C * P / wall time) and a decode round (C requests generating G tokens, greedy, no stop token): time to first
// token (TTFT), inter-token latency (ITL: gaps between successive token arrivals of a request, a gap spread evenly
// over the tokens that arrived together) and decode tok/s (tokens after each request's first, summed, over the
// span from the last first token to the last token). One JSON line per level. Greedy requests take the engine's
// forward_greedy (the token picked on the device). Each level also takes its decode round's TTFT apart (queue,
// wait, prefill, bookkeeping, delivery; the admission rounds' sizes: ttft_parts). With --profile the CUDA engine prints per-phase
// device times per step kind (PROFILE lines, stderr) when it shuts down. --speculative mtp: the config's MTP layer
// drafts a token per step, verified by the main model (speculative.h); each level then reports the drafts
// verified and accepted in its decode round. --model DIR: a checkpoint's weights instead of random ones (random
// weights make a random MTP: its drafts are rarely accepted, so only a trained model shows the acceptance rate).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>
#include <thread>

#include "command.h"
#include "core/error.h"
#include "infer/engine.h"
#include "infer/model_loader.h"
#include "infer/speculative.h"
#include "infer/scheduler.h"

namespace {

using namespace trex;
using Clock = std::chrono::steady_clock;

struct BenchServeArgs {
  std::string config, model, device = "cuda", levels = "1,16,64", speculative = "off";
  int64_t prompt_tokens = 512, gen_tokens = 64, max_context = 0, step_prompt_tokens = 0;
  uint64_t seed = 1;
  bool moe_grouped = false;
  bool profile = false;
};

struct Trace {
  Clock::time_point t0;
  std::vector<std::pair<Clock::time_point, int64_t>> arrivals;  // (time, tokens that arrived together)
  infer::RequestTimeline timeline;                               // the scheduler's side of its TTFT
  std::string error;
};

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[size_t(std::llround(q / 100.0 * double(v.size() - 1)))];
}

std::vector<Trace> round_trip(infer::Scheduler& sched, int64_t C, int64_t P, int64_t G, int64_t V, std::mt19937& rng,
                              double& wall_s) {
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(C));
  for (auto& p : prompts)
    for (int64_t k = 0; k < P; ++k) p.push_back(int32_t(2 + rng() % uint32_t(V - 2)));
  std::vector<Trace> tr(static_cast<size_t>(C));
  std::vector<std::thread> th;
  const auto start = Clock::now();
  for (int64_t i = 0; i < C; ++i)
    th.emplace_back([&, i] {
      Trace& t = tr[size_t(i)];
      try {
        infer::RequestSpec s;
        s.prompt = prompts[size_t(i)];
        s.sampling.temperature = 0.0;
        s.max_tokens = G;
        t.t0 = Clock::now();
        auto r = sched.submit(std::move(s));
        std::vector<int32_t> got;
        for (;;) {
          const size_t before = got.size();
          const bool done = r->wait(got, std::chrono::milliseconds(100));
          if (got.size() > before) t.arrivals.emplace_back(Clock::now(), int64_t(got.size() - before));
          if (done) break;
        }
        t.timeline = r->timeline();
        if (r->finish_reason() != "length") t.error = fmt::format("finished with '{}' {}", r->finish_reason(), r->error());
      } catch (const std::exception& e) {
        t.error = e.what();
      }
    });
  for (auto& x : th) x.join();
  wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  return tr;
}

// The decode round's TTFT taken apart (p50 of each part over the requests): the queue (submit -> admitted into a
// slot), the wait for the step that first fed it (admitted -> that step starts), prefill (that step's start -> the
// return of the step that fed its last prompt chunk), the step's bookkeeping up to the publish, and the delivery
// to the client thread; plus how the requests were admitted (round sizes, in order) and the token counts of the
// steps that gave first tokens. A TTFT that moves with the admission rounds (how many requests the first step
// took) is the scheduling, one that moves with prefill at the same rounds is the engine.
struct TtftParts {
  double queue = 0, wait = 0, prefill = 0, publish = 0, deliver = 0, steps = 0;
  std::string rounds, first_steps;
};

TtftParts ttft_parts(const std::vector<Trace>& tr) {
  std::vector<double> q, w, p, pub, d, st;
  std::vector<std::pair<Clock::time_point, int64_t>> rounds;      // (admitted, requests)
  std::vector<std::pair<Clock::time_point, int64_t>> first_steps;  // (step end, tokens)
  for (const Trace& t : tr) {
    const infer::RequestTimeline& l = t.timeline;
    if (t.arrivals.empty() || l.first_token == Clock::time_point{}) continue;
    q.push_back(ms(l.admitted - l.submitted));
    w.push_back(ms(l.first_step - l.admitted));
    p.push_back(ms(l.prompt_done - l.first_step));
    pub.push_back(ms(l.first_token - l.prompt_done));
    d.push_back(ms(t.arrivals.front().first - l.first_token));
    st.push_back(double(l.steps_to_first_token));
    rounds.emplace_back(l.admitted, l.admitted_with);
    first_steps.emplace_back(l.prompt_done, l.first_token_step_tokens);
  }
  auto distinct = [](std::vector<std::pair<Clock::time_point, int64_t>> v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    std::string out;
    for (const auto& [when, n] : v) out += (out.empty() ? "" : ",") + std::to_string(n);
    return out;
  };
  return TtftParts{pct(q, 50), pct(w, 50), pct(p, 50), pct(pub, 50), pct(d, 50), pct(st, 50), distinct(rounds),
                   distinct(first_steps)};
}

void run(const BenchServeArgs& a) {
  TREX_CHECK(a.device == "cuda", "bench-serve: --device {} unsupported (cuda)", a.device);
  std::vector<int64_t> levels;
  {
    std::stringstream ss(a.levels);
    std::string item;
    while (std::getline(ss, item, ',')) levels.push_back(std::stoll(item));
  }
  TREX_CHECK(!levels.empty(), "bench-serve: --concurrency is empty");
  const int64_t slots = *std::max_element(levels.begin(), levels.end());
  TREX_CHECK(a.config.empty() != a.model.empty(), "bench-serve: give exactly one of --config and --model");
  TREX_CHECK(a.speculative == "off" || a.speculative == "mtp", "bench-serve: --speculative must be off or mtp, got '{}'",
             a.speculative);
  const bool spec = a.speculative == "mtp";
  std::unique_ptr<dsv4::Model<float>> weights;
  if (!a.model.empty()) weights = infer::load_inference_model(a.model, /*with_mtp=*/spec);
  const dsv4::ModelConfig cfg = weights ? weights->config() : dsv4::load_model_config(a.config);
  const std::string source = weights ? a.model : a.config;
#ifdef TREX_HAVE_CUDA
  infer::CudaEngineOptions eo;
  eo.slots = slots;
  eo.max_context = a.max_context > 0 ? a.max_context : a.prompt_tokens + a.gen_tokens + 64;
  eo.seed = a.seed;
  eo.moe_grouped_gemm = a.moe_grouped;
  eo.profile = a.profile;
  auto engine = infer::make_cuda_engine(cfg, weights ? &weights->params() : nullptr, eo, spec);
  weights.reset();  // the GPU holds its copy
#else
  std::unique_ptr<infer::Engine> engine;
  fail("bench-serve: this trex was built without CUDA");
#endif
  infer::SchedulerOptions so;
  so.max_queue = 4 * slots;
  so.prefill_chunk = a.prompt_tokens;
  so.step_prompt_tokens = a.step_prompt_tokens;
  infer::SpeculativeEngine* se = spec ? infer::speculative_engine(*engine) : nullptr;
  infer::Scheduler sched(std::move(engine), so);
  std::mt19937 rng(uint32_t(a.seed));
  double wall = 0;
  round_trip(sched, 2, 32, 4, cfg.vocab_size, rng, wall);  // warm-up: GEMM plans, memory pool
  bool ok = true;
  for (int64_t C : levels) {
    double wall_p = 0, wall_d = 0;
    const auto pre = round_trip(sched, C, a.prompt_tokens, 1, cfg.vocab_size, rng, wall_p);
    const infer::SpeculativeStats s0 = se ? se->speculative_stats() : infer::SpeculativeStats{};
    const int64_t steps0 = sched.metrics().steps;
    const auto dec = round_trip(sched, C, a.prompt_tokens, a.gen_tokens, cfg.vocab_size, rng, wall_d);
    infer::SpeculativeStats sd = se ? se->speculative_stats() : infer::SpeculativeStats{};
    sd.drafted -= s0.drafted, sd.accepted -= s0.accepted, sd.verify_steps -= s0.verify_steps;
    const int64_t dec_steps = sched.metrics().steps - steps0;
    std::string err;
    for (const auto* v : {&pre, &dec})
      for (const Trace& t : *v)
        if (!t.error.empty() && err.empty()) err = t.error;
    if (!err.empty()) {
      ok = false;
      std::printf("FAIL bench-serve C=%lld: %s\n", (long long)C, err.c_str());
      continue;
    }
    std::vector<double> ttft, itl;
    int64_t ntok = 0;
    Clock::time_point first_last{}, end_last{};
    for (const Trace& t : dec) {
      if (t.arrivals.empty()) continue;
      ttft.push_back(ms(t.arrivals.front().first - t.t0));
      first_last = std::max(first_last, t.arrivals.front().first);
      end_last = std::max(end_last, t.arrivals.back().first);
      for (size_t k = 0; k < t.arrivals.size(); ++k) {
        ntok += t.arrivals[k].second;
        if (k == 0) continue;
        const double gap = ms(t.arrivals[k].first - t.arrivals[k - 1].first) / double(t.arrivals[k].second);
        for (int64_t j = 0; j < t.arrivals[k].second; ++j) itl.push_back(gap);
      }
    }
    const double span = std::chrono::duration<double>(end_last - first_last).count();
    const double dec_tps = span > 0 ? double(ntok - C) / span : 0.0;
    if (ntok != C * a.gen_tokens) {
      ok = false;
      std::printf("FAIL bench-serve C=%lld: %lld tokens, expected %lld\n", (long long)C, (long long)ntok,
                  (long long)(C * a.gen_tokens));
    }
    const double pre_tps = double(C * a.prompt_tokens) / wall_p;
    std::printf("C=%3lld: prefill %.0f tok/s (%lldx%lld prompt tokens in %.3f s); decode %.0f tok/s; TTFT p50/p90/p99 "
                "%.1f/%.1f/%.1f ms; ITL p50/p90/p99 %.2f/%.2f/%.2f ms\n",
                (long long)C, pre_tps, (long long)C, (long long)a.prompt_tokens, wall_p, dec_tps, pct(ttft, 50),
                pct(ttft, 90), pct(ttft, 99), pct(itl, 50), pct(itl, 90), pct(itl, 99));
    const TtftParts tp = ttft_parts(dec);
    std::printf("C=%3lld: TTFT p50 parts: queue %.1f ms, wait for its first step %.1f ms, prefill %.1f ms (%.0f "
                "steps), step bookkeeping %.2f ms, delivery %.2f ms; admitted in rounds of [%s] requests; first "
                "tokens from steps of [%s] tokens\n",
                (long long)C, tp.queue, tp.wait, tp.prefill, tp.steps, tp.publish, tp.deliver, tp.rounds.c_str(),
                tp.first_steps.c_str());
    if (spec)
      std::printf("C=%3lld: speculative mtp: %lld drafts verified, %lld accepted (acceptance %.3f); decode round %lld "
                  "steps for %lld tokens\n",
                  (long long)C, (long long)sd.drafted, (long long)sd.accepted, sd.acceptance(), (long long)dec_steps,
                  (long long)ntok);
    std::printf(
        "BENCH_SERVE {\"config\": \"%s\", \"engine\": \"cuda\", \"speculative\": \"%s\", \"drafts\": %lld, "
        "\"accepted\": %lld, \"decode_steps\": %lld, \"moe_grouped\": %s, \"concurrency\": %lld, "
        "\"prompt_tokens\": %lld, \"step_prompt_tokens\": %lld, \"gen_tokens\": %lld, \"prefill_tok_s\": %.1f, \"prefill_round_s\": %.3f, "
        "\"decode_tok_s\": %.1f, \"decode_round_s\": %.3f, \"completion_tokens\": %lld, \"ttft_ms_p50\": %.1f, "
        "\"ttft_ms_p90\": %.1f, \"ttft_ms_p99\": %.1f, \"itl_ms_p50\": %.2f, \"itl_ms_p90\": %.2f, "
        "\"itl_ms_p99\": %.2f, \"ttft_queue_ms_p50\": %.1f, \"ttft_wait_ms_p50\": %.1f, "
        "\"ttft_prefill_ms_p50\": %.1f, \"ttft_publish_ms_p50\": %.2f, \"ttft_deliver_ms_p50\": %.2f, "
        "\"admission_rounds\": [%s], \"first_token_step_tokens\": [%s]}\n",
        source.c_str(), a.speculative.c_str(), (long long)sd.drafted, (long long)sd.accepted, (long long)dec_steps,
        a.moe_grouped ? "true" : "false", (long long)C, (long long)a.prompt_tokens,
        (long long)a.step_prompt_tokens, (long long)a.gen_tokens, pre_tps, wall_p, dec_tps, wall_d, (long long)ntok, pct(ttft, 50), pct(ttft, 90),
        pct(ttft, 99), pct(itl, 50), pct(itl, 90), pct(itl, 99), tp.queue, tp.wait, tp.prefill, tp.publish,
        tp.deliver, tp.rounds.c_str(), tp.first_steps.c_str());
    std::fflush(stdout);
  }
  const infer::SchedulerMetrics m = sched.metrics();
  std::printf("%s bench-serve: %lld requests finished, %lld failed, %lld active at the end, cache %lld bytes\n",
              ok && m.requests_failed == 0 && m.active == 0 ? "PASS" : "FAIL", (long long)m.requests_finished,
              (long long)m.requests_failed, (long long)m.active, (long long)m.cache_bytes);
  sched.stop();
}

const bool registered = trex::cli::register_command(
    {"bench-serve", "in-process load test of the serving stack (scheduler + GPU engine, random bf16 weights)",
     [](CLI::App& app) {
       auto a = std::make_shared<BenchServeArgs>();
       app.add_option("--config", a->config, "model config.json (random weights)");
       app.add_option("--model", a->model, "checkpoint directory (its weights; instead of --config)");
       app.add_option("--speculative", a->speculative,
                      "off, or mtp: the MTP layer drafts one token per step, verified by the main model")
           ->capture_default_str();
       app.add_option("--device", a->device, "cuda")->capture_default_str();
       app.add_option("--concurrency", a->levels, "comma-separated concurrency levels")->capture_default_str();
       app.add_option("--prompt-tokens", a->prompt_tokens, "prompt tokens per request")->capture_default_str();
       app.add_option("--gen-tokens", a->gen_tokens, "generated tokens per request")->capture_default_str();
       app.add_option("--step-prompt-tokens", a->step_prompt_tokens,
                      "prompt tokens per step over all requests (0: no bound), as trex serve's option")
           ->capture_default_str();
       app.add_option("--max-context", a->max_context, "engine context (default prompt + gen + 64)");
       app.add_option("--seed", a->seed, "weights and prompts seed")->capture_default_str();
       app.add_flag("--moe-grouped", a->moe_grouped,
                    "routed experts as one grouped GEMM (no host read of the expert counts per layer)");
       app.add_flag("--profile", a->profile, "per-phase device times per step kind (PROFILE lines on stderr)");
       app.callback([a] { run(*a); });
     }});

}  // namespace
