// `trex generate`: decode with the CPU incremental decoder or, with --device cuda, the GPU engine. With a tokenizer, text in and out (optionally the
// DeepSeek-V4 chat format, thinking on or off); without one, token ids in and out.
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "command.h"
#include "core/error.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "infer/decoder.h"
#include "infer/engine.h"
#include "infer/generate.h"
#include "infer/model_loader.h"
#include "infer/speculative.h"

namespace {

namespace fs = std::filesystem;
using namespace trex;

struct GenerateArgs {
  std::string model, prompt, prompt_ids, tokenizer, device = "cpu", speculative = "off";
  int64_t max_new_tokens = 64, max_context = 0, batch = 1, prefill_chunk = 0;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 0;
  bool chat = false, thinking = false, ignore_eos = false;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && item[used] == ' ') ++used;
    TREX_CHECK(used == item.size() && !item.empty() && v >= 0 && v <= INT32_MAX,
               "--prompt-ids: '{}' is not a token id (expected a comma-separated list like 0,17,42)", item);
    ids.push_back(int32_t(v));
  }
  TREX_CHECK(!ids.empty(), "--prompt-ids is empty");
  return ids;
}

void run(const GenerateArgs& a) {
  TREX_CHECK(a.prompt.empty() != a.prompt_ids.empty(), "give exactly one of --prompt and --prompt-ids");
  TREX_CHECK(a.batch >= 1, "--batch must be >= 1");
  std::unique_ptr<data::Tokenizer> tok;
  std::string tok_path = a.tokenizer;
  if (tok_path.empty() && fs::exists(fs::path(a.model) / "tokenizer.json"))
    tok_path = (fs::path(a.model) / "tokenizer.json").string();
  if (!tok_path.empty()) tok = std::make_unique<data::Tokenizer>(data::Tokenizer::load(tok_path));

  TREX_CHECK(a.speculative == "off" || a.speculative == "mtp", "--speculative must be off or mtp, got '{}'",
             a.speculative);
  const bool spec = a.speculative == "mtp";
  TREX_CHECK(!spec || a.device == "cuda", "--speculative mtp needs --device cuda");
  auto model = infer::load_inference_model(a.model, /*with_mtp=*/spec);
  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    TREX_CHECK(!a.chat, "--chat needs --prompt (text) and a tokenizer");
    prompt = parse_ids(a.prompt_ids);
  } else {
    TREX_CHECK(tok != nullptr, "--prompt needs a tokenizer (--tokenizer FILE, or tokenizer.json in {})",
               a.model);
    if (a.chat) {
      prompt = data::encode_prompt(*tok, {data::ChatMessage{"user", a.prompt, ""}}, a.thinking);
    } else {
      TREX_CHECK(!a.thinking, "--thinking needs --chat");
      prompt.push_back(int32_t(model->config().bos_token_id));
      tok->encode_append(a.prompt, prompt, /*allow_special=*/true);
    }
  }
  TREX_CHECK(a.device == "cpu" || a.device == "cuda", "--device must be cpu or cuda, got '{}'", a.device);
  std::unique_ptr<infer::Engine> engine;
  std::unique_ptr<infer::Decoder> dec;
  if (a.device == "cuda") {
#ifdef TREX_HAVE_CUDA
    infer::CudaEngineOptions eo;
    eo.slots = a.batch;
    eo.max_context = a.max_context;
    engine = infer::make_cuda_engine(model->config(), &model->params(), eo, spec);
#else
    fail("--device cuda: this trex was built without CUDA (configure with -DTREX_CUDA=ON)");
#endif
  } else {
    dec = std::make_unique<infer::Decoder>(*model, a.max_context);
  }
  infer::GenerateOptions go;
  go.max_new_tokens = a.max_new_tokens;
  go.min_new_tokens = a.ignore_eos ? a.max_new_tokens : 0;
  go.sampling = {a.temperature, a.top_p, a.seed};
  go.prefill_chunk = a.prefill_chunk;
  if (tok) {
    const int32_t eos = tok->token_to_id("<\uff5cend\u2581of\u2581sentence\uff5c>");
    go.stop_ids.push_back(int32_t(model->config().eos_token_id));
    if (eos >= 0 && eos != go.stop_ids[0]) go.stop_ids.push_back(eos);
  }
  const std::vector<std::vector<int32_t>> prompts(size_t(a.batch), prompt);
  // Batch 1 with a tokenizer: print text as it comes (whole UTF-8 characters only).
  std::vector<int32_t> shown;
  size_t printed = 0;
  auto on_token = [&](size_t i, int32_t t) {
    if (a.batch != 1 || !tok) return;
    shown.push_back(t);
    const std::string text = tok->decode(shown);
    size_t n = text.size();
    while (n > printed && (static_cast<unsigned char>(text[n - 1]) & 0xC0) == 0x80) --n;
    if (n > printed && static_cast<unsigned char>(text[n - 1]) >= 0xC0) --n;
    std::fwrite(text.data() + printed, 1, n - printed, stdout);
    std::fflush(stdout);
    printed = n;
    (void)i;
  };
  infer::GenerateStats st;
  const auto out = engine ? infer::generate(*engine, prompts, go, on_token, &st)
                         : infer::generate(*dec, prompts, go, on_token, &st);
  for (size_t i = 0; i < out.size(); ++i) {
    if (a.batch == 1 && tok) {
      const std::string text = tok->decode(shown);
      std::fwrite(text.data() + printed, 1, text.size() - printed, stdout);
      std::printf("\n");
      continue;
    }
    if (tok) {
      std::printf("[%zu] %s\n", i, tok->decode(out[i].tokens).c_str());
    } else {
      std::string s;
      for (size_t k = 0; k < out[i].tokens.size(); ++k)
        s += (k ? "," : "") + std::to_string(out[i].tokens[k]);
      std::printf("%s%s\n", a.batch > 1 ? fmt::format("[{}] ", i).c_str() : "", s.c_str());
    }
  }
  std::fprintf(
      stderr,
      "prompt %zu tokens x %lld sequences: prefill %.3f s (%.1f tok/s); decode %lld tokens in %lld steps, "
      "%.3f s (%.1f tok/s); finish: %s\n",
      prompt.size(), (long long)a.batch, st.prefill_seconds,
      st.prefill_seconds > 0 ? double(st.prefill_tokens) / st.prefill_seconds : 0.0,
      (long long)st.decode_tokens, (long long)st.decode_steps, st.decode_seconds,
      st.decode_seconds > 0 ? double(st.decode_tokens) / st.decode_seconds : 0.0,
      out.empty() ? "-" : out[0].finish_reason.c_str());
  if (spec) {
    const infer::SpeculativeStats ss = infer::speculative_engine(*engine)->speculative_stats();
    std::fprintf(stderr, "speculative mtp: %lld drafts verified, %lld accepted (acceptance %.3f)%s\n",
                 (long long)ss.drafted, (long long)ss.accepted, ss.acceptance(),
                 a.temperature == 0.0 && !a.ignore_eos ? "" : " (off: sampling or --ignore-eos decode plainly)");
  }
}

const bool registered = trex::cli::register_command(
    {"generate", "generate text (or token ids) with a DeepSeek-V4 model (CPU or GPU)", [](CLI::App& app) {
       auto a = std::make_shared<GenerateArgs>();
       app.add_option("--model", a->model, "model directory (config.json + safetensors)")->required();
       app.add_option("--prompt", a->prompt, "prompt text (needs a tokenizer)");
       app.add_option("--prompt-ids", a->prompt_ids,
                      "prompt token ids, comma-separated (no tokenizer needed)");
       app.add_option("--tokenizer", a->tokenizer, "tokenizer.json (default: the model directory's, if any)");
       app.add_option("--max-new-tokens", a->max_new_tokens, "tokens to generate at most")
           ->capture_default_str();
       app.add_option("--temperature", a->temperature, "sampling temperature (0 = greedy)")
           ->capture_default_str();
       app.add_option("--top-p", a->top_p, "nucleus sampling mass in (0, 1]")->capture_default_str();
       app.add_option("--seed", a->seed, "sampling seed (sequence i of a batch uses seed + i)")
           ->capture_default_str();
       app.add_flag("--chat", a->chat, "wrap the prompt as one user turn of the DeepSeek-V4 chat format");
       app.add_flag("--thinking", a->thinking, "chat in thinking mode (<think> opens the answer)");
       app.add_option("--max-context", a->max_context, "context limit (default: the config's max_position)");
       app.add_option("--batch", a->batch, "decode this many copies of the prompt together (throughput)")
           ->capture_default_str();
       app.add_option("--prefill-chunk", a->prefill_chunk,
                      "prefill at most this many tokens per step (0 = all)");
       app.add_flag("--ignore-eos", a->ignore_eos, "always generate --max-new-tokens tokens");
       app.add_option("--device", a->device, "cpu (fp32 decoder) or cuda (bf16 GPU engine)")->capture_default_str();
       app.add_option("--speculative", a->speculative,
                      "off, or mtp: the checkpoint's MTP layer drafts one token per step, verified by the main "
                      "model (--device cuda; greedy without --ignore-eos, else plain)")
           ->capture_default_str();
       app.callback([a] { run(*a); });
     }});

}  // namespace
