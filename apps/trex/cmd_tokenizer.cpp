// trex tokenizer train|encode|decode|bench: byte-level BPE on Hugging Face tokenizer.json files.
#include <fmt/format.h>

#include <chrono>
#include <fstream>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "data/bpe_trainer.h"
#include "data/tokenizer.h"

namespace {

using json = nlohmann::json;

// Feeds a corpus file to `add`: JSONL lines contribute "text" or every message's content and reasoning;
// other files are read whole.
template <class F>
void for_each_text(const std::string& path, F&& add) {
  if (path.size() < 6 || path.substr(path.size() - 6) != ".jsonl") {
    add(trex::read_text_file(path));
    return;
  }
  std::ifstream f(path);
  TREX_CHECK(f.good(), "{}: cannot open", path);
  std::string line;
  int64_t n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      trex::fail("{}:{}: invalid JSON: {}", path, n, e.what());
    }
    if (j.contains("text") && j["text"].is_string()) add(j["text"].get<std::string>());
    if (j.contains("messages") && j["messages"].is_array())
      for (const auto& m : j["messages"])
        for (const char* k : {"content", "reasoning_content", "reasoning"})
          if (m.contains(k) && m[k].is_string()) add(m[k].get<std::string>());
  }
}

void setup(CLI::App& app) {
  app.require_subcommand(1);
  struct Args {
    std::vector<std::string> inputs;
    std::string out, tokenizer, text, ids;
    int64_t vocab_size = 4096, min_frequency = 2;
    int repeat = 3;
  };
  auto a = std::make_shared<Args>();

  CLI::App* tr = app.add_subcommand("train", "learn a byte-level BPE from a corpus, write tokenizer.json");
  tr->add_option("--input", a->inputs, "corpus files (.jsonl: text / messages; else plain text)")->required();
  tr->add_option("--vocab-size", a->vocab_size, "total vocabulary incl. special tokens")->capture_default_str();
  tr->add_option("--min-frequency", a->min_frequency, "stop when the best pair is rarer")->capture_default_str();
  tr->add_option("--out", a->out, "tokenizer.json to write")->required();
  tr->callback([a] {
    trex::data::BpeTrainOptions o;
    o.vocab_size = a->vocab_size;
    o.min_frequency = a->min_frequency;
    o.show_progress = true;
    trex::data::BpeTrainer trainer(o);
    int64_t bytes = 0;
    for (const auto& in : a->inputs)
      for_each_text(in, [&](const std::string& t) {
        bytes += int64_t(t.size());
        trainer.add_text(t);
      });
    auto tok = trainer.train();
    tok.save(a->out);
    fmt::print("{{\"vocab_size\": {}, \"corpus_bytes\": {}, \"pieces\": {}, \"out\": \"{}\"}}\n", tok.vocab_size(),
               bytes, trainer.pieces_seen(), a->out);
  });

  CLI::App* enc = app.add_subcommand("encode", "print the token ids of a text");
  enc->add_option("--tokenizer", a->tokenizer, "tokenizer.json")->required();
  enc->add_option("text", a->text, "text to encode")->required();
  enc->callback([a] {
    auto tok = trex::data::Tokenizer::load(a->tokenizer);
    fmt::print("{}\n", json(tok.encode(a->text)).dump());
  });

  CLI::App* dec = app.add_subcommand("decode", "print the text of token ids (a JSON list)");
  dec->add_option("--tokenizer", a->tokenizer, "tokenizer.json")->required();
  dec->add_option("ids", a->ids, "e.g. [0, 15, 27]")->required();
  dec->callback([a] {
    auto tok = trex::data::Tokenizer::load(a->tokenizer);
    fmt::print("{}\n", tok.decode(json::parse(a->ids).get<std::vector<int32_t>>()));
  });

  CLI::App* bench = app.add_subcommand("bench", "encoding throughput (MB/s) and round-trip check on a corpus");
  bench->add_option("--tokenizer", a->tokenizer, "tokenizer.json")->required();
  bench->add_option("--input", a->inputs, "corpus files")->required();
  bench->add_option("--repeat", a->repeat, "passes over the corpus")->capture_default_str();
  bench->callback([a] {
    auto tok = trex::data::Tokenizer::load(a->tokenizer);
    std::vector<std::string> texts;
    for (const auto& in : a->inputs) for_each_text(in, [&](const std::string& t) { texts.push_back(t); });
    int64_t bytes = 0, tokens = 0, mismatches = 0;
    double best = 1e30;
    for (int r = 0; r < a->repeat; ++r) {
      auto fresh = tok;  // cold piece cache each pass
      int64_t tk = 0;
      auto t0 = std::chrono::steady_clock::now();
      for (const auto& t : texts) tk += int64_t(fresh.encode(t, false).size());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      tokens = tk;
    }
    for (const auto& t : texts) {
      bytes += int64_t(t.size());
      mismatches += tok.decode(tok.encode(t, false)) != t;
    }
    fmt::print("{{\"bytes\": {}, \"tokens\": {}, \"bytes_per_token\": {:.3f}, \"seconds\": {:.4f}, \"mb_per_s\": {:.2f}, "
               "\"round_trip_mismatches\": {}}}\n",
               bytes, tokens, double(bytes) / double(std::max<int64_t>(tokens, 1)), best, double(bytes) / best / 1e6,
               mismatches);
  });
}

const bool registered = trex::cli::register_command({"tokenizer", "byte-level BPE tokenizer: train, encode, decode, bench", setup});

}  // namespace
