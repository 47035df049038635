// trex data prepare: JSONL (CPT {"text"} / SFT {"messages"}) -> packed, memory-mapped token shards.
#include <fmt/format.h>

#include "command.h"
#include "core/error.h"
#include "data/shards.h"

namespace {

struct PrepareArgs {
  std::string tokenizer, out, format = "auto", thinking = "auto", long_chats = "truncate";
  std::vector<std::string> inputs;
  int64_t seq_len = 512, rows_per_shard = 4096;
  bool skip_bad = false;
};

void setup(CLI::App& app) {
  app.require_subcommand(1);
  auto a = std::make_shared<PrepareArgs>();
  CLI::App* p = app.add_subcommand("prepare", "tokenize and pack JSONL into shards");
  p->add_option("--tokenizer", a->tokenizer, "tokenizer.json")->required();
  p->add_option("--input", a->inputs, "JSONL file(s)")->required();
  p->add_option("--out", a->out, "output directory")->required();
  p->add_option("--seq-len", a->seq_len, "tokens per packed row")->capture_default_str();
  p->add_option("--rows-per-shard", a->rows_per_shard, "rows per shard file")->capture_default_str();
  p->add_option("--format", a->format, "auto | cpt | sft")->capture_default_str();
  p->add_option("--thinking", a->thinking, "SFT reasoning rendering: auto | on | off")->capture_default_str();
  p->add_option("--long-chats", a->long_chats,
                 "a chat longer than --seq-len: truncate (its first seq-len tokens) | drop")
      ->capture_default_str();
  p->add_flag("--skip-bad", a->skip_bad, "skip malformed lines (each is reported) instead of failing");
  p->callback([a] {
    trex::data::PrepareOptions o;
    o.seq_len = a->seq_len;
    o.rows_per_shard = a->rows_per_shard;
    o.format = a->format;
    o.skip_bad_lines = a->skip_bad;
    o.long_chats = trex::data::parse_long_chats(a->long_chats, "--long-chats");
    o.show_progress = true;
    TREX_CHECK(a->thinking == "auto" || a->thinking == "on" || a->thinking == "off",
               "--thinking '{}' (expected auto, on or off)", a->thinking);
    o.thinking = a->thinking == "on"    ? trex::data::ThinkingMode::On
                 : a->thinking == "off" ? trex::data::ThinkingMode::Off
                                        : trex::data::ThinkingMode::Auto;
    auto tok = trex::data::Tokenizer::load(a->tokenizer);
    std::vector<std::filesystem::path> in(a->inputs.begin(), a->inputs.end());
    auto st = trex::data::prepare_shards(tok, in, a->out, o);
    fmt::print("{}\n", st.to_json().dump());
  });
}

const bool registered = trex::cli::register_command({"data", "training data: prepare shards", setup});

}  // namespace
