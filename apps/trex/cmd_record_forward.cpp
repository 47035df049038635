// `trex record-forward`: one forward of the CPU model on given token ids, written with its logits, per-layer hidden
// states and router / indexer selections (src/model/dsv4/forward_record.h) for python/hf_check/compare.py.
#include <cstdio>
#include <filesystem>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "data/chat.h"
#include "data/tokenizer.h"
#include "model/dsv4/config.h"
#include "model/dsv4/forward_record.h"

namespace {

namespace fs = std::filesystem;
using namespace trex;

struct RecordArgs {
  std::string model, ids, ids_file, prompt_file, tokenizer, out;
  bool chat = false, fp64 = false;
};

void run(const RecordArgs& a) {
  TREX_CHECK(int(!a.ids.empty()) + int(!a.ids_file.empty()) + int(!a.prompt_file.empty()) == 1,
             "give exactly one of --ids, --ids-file and --prompt-file");
  std::vector<int32_t> ids;
  int64_t B = 1, S = 0;
  if (!a.prompt_file.empty()) {
    std::string tok_path = a.tokenizer.empty() ? (fs::path(a.model) / "tokenizer.json").string() : a.tokenizer;
    TREX_CHECK(fs::exists(tok_path), "--prompt-file needs a tokenizer: {} does not exist (--tokenizer FILE)",
               tok_path);
    const data::Tokenizer tok = data::Tokenizer::load(tok_path);
    const std::string text = read_text_file(a.prompt_file);
    if (a.chat) {
      ids = data::encode_prompt(tok, {data::ChatMessage{"user", text, ""}}, /*thinking=*/false);
    } else {
      ids.push_back(int32_t(dsv4::load_model_config(fs::path(a.model) / "config.json").bos_token_id));
      tok.encode_append(text, ids, /*allow_special=*/true);
    }
    S = int64_t(ids.size());
  } else {
    TREX_CHECK(!a.chat, "--chat needs --prompt-file");
    const std::string where = a.ids_file.empty() ? "--ids" : a.ids_file;
    ids = dsv4::parse_id_rows(a.ids_file.empty() ? a.ids : read_text_file(a.ids_file), where, &B, &S);
  }
  dsv4::ForwardRecordOptions o;
  o.fp64 = a.fp64;
  const json summary = dsv4::record_forward(a.model, ids, B, S, a.out, o);
  std::printf("%s\n", summary.dump().c_str());
}

const bool registered = trex::cli::register_command(
    {"record-forward", "run the CPU model once on token ids; write logits, hidden states, selections",
     [](CLI::App& app) {
       auto a = std::make_shared<RecordArgs>();
       app.add_option("--model", a->model, "model directory (config.json + safetensors)")->required();
       app.add_option("--ids", a->ids, "token ids as JSON: [0, 17, 42] or equal-length rows [[...], [...]]");
       app.add_option("--ids-file", a->ids_file, "a file holding such JSON");
       app.add_option("--prompt-file", a->prompt_file, "a text file to encode (BOS + text, or --chat)");
       app.add_option("--tokenizer", a->tokenizer, "tokenizer.json (default: the model directory's)");
       app.add_flag("--chat", a->chat, "encode --prompt-file as one user turn of the chat format");
       app.add_flag("--fp64", a->fp64, "run the model in double precision");
       app.add_option("--out", a->out, "safetensors file to write")->required();
       app.callback([a] { run(*a); });
     }});

}  // namespace
