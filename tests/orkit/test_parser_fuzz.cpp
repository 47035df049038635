// Seeded mutation fuzzing of every parser that reads files a model or a benchmark provides: the LP
// reader, the MPS reader, the MathProg translator (syntax only) and the benchmark JSONL reader. Each
// mutated input must either parse or throw trex::Error naming its source (no other exception, no crash),
// within a time bound and an allocation bound per input. The mutations are deterministic (fixed seeds),
// so a failure reproduces; the failing input is printed escaped.
#include <gtest/gtest.h>
#include <malloc.h>

#include <chrono>
#include <cstdlib>
#include <new>
#include <random>

#include "core/error.h"
#include "core/files.h"
#include "orkit/eval/benchmark.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/mps_format.h"
#include "orkit/lp/text_input.h"
#include "orkit/solve/mathprog.h"

#ifdef TREX_HAVE_GLPK
#include <glpk.h>
#endif

// ---- allocation accounting (this test binary only): bytes live on the calling thread, with a budget
// that makes operator new throw std::bad_alloc once exceeded, so a runaway parser stops instead of
// exhausting the machine.
namespace {
thread_local long long tl_live = 0, tl_peak = 0, tl_limit = 0;  // tl_limit 0: no budget

void* counted_alloc(std::size_t n) {
  if (tl_limit > 0 && tl_live + static_cast<long long>(n) > tl_limit) throw std::bad_alloc();
  void* p = std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  tl_live += static_cast<long long>(malloc_usable_size(p));
  if (tl_live > tl_peak) tl_peak = tl_live;
  return p;
}
void counted_free(void* p) noexcept {
  if (!p) return;
  tl_live -= static_cast<long long>(malloc_usable_size(p));
  std::free(p);
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n); }
void* operator new[](std::size_t n) { return counted_alloc(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }

namespace {

namespace fs = std::filesystem;
using namespace trex::orkit;

std::string seed(const char* name) {
  return trex::read_text_file(trex::source_dir() / "tests" / "data" / "fuzz" / name);
}

std::string escaped(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '\n')
      o += "\\n";
    else if (c >= 0x20 && c < 0x7f && c != '\\')
      o += char(c);
    else
      o += fmt::format("\\x{:02x}", c);
  }
  return o;
}

// Byte-level and token-level mutations: flips, inserts of bytes that parsers trip on (NUL, 0xff,
// brackets, relations, signs, huge and tiny exponents), deletions, duplications and truncation.
class Mutator {
 public:
  Mutator(uint64_t seed, std::vector<std::string> dictionary) : rng_(seed), dict_(std::move(dictionary)) {
    for (const char* w : {"\0", "\xff", "\xc3", "\x1b", "[", "]", "^", "*", "/", ":", "<=", ">=", "=", "-",
                          "+", "\n", "\r\n", " ", "\\", "\\*", "e", "1e308", "1e-400", "-inf", "inf", "nan",
                          "0", "999999999999999999999", "\"", "{", "}", "'", ";", ","})
      dict_.push_back(std::string(w, w[0] == '\0' ? 1 : std::strlen(w)));
  }

  std::string mutate(std::string s) {
    const int rounds = 1 + int(rng_() % 4);
    for (int r = 0; r < rounds; ++r) s = once(std::move(s));
    return s;
  }

 private:
  size_t pos(const std::string& s) { return s.empty() ? 0 : rng_() % (s.size() + 1); }
  std::string once(std::string s) {
    switch (rng_() % 7) {
      case 0:  // flip a byte to any value
        if (!s.empty()) s[rng_() % s.size()] = char(rng_() % 256);
        break;
      case 1:  // insert a dictionary word
        s.insert(pos(s), dict_[rng_() % dict_.size()]);
        break;
      case 2: {  // delete a range
        if (s.empty()) break;
        const size_t a = rng_() % s.size(), n = 1 + rng_() % std::min<size_t>(32, s.size() - a);
        s.erase(a, n);
        break;
      }
      case 3: {  // duplicate a range somewhere else
        if (s.empty()) break;
        const size_t a = rng_() % s.size(), n = 1 + rng_() % std::min<size_t>(64, s.size() - a);
        const std::string piece = s.substr(a, n);
        s.insert(pos(s), piece);
        break;
      }
      case 4:  // truncate
        s.resize(pos(s));
        break;
      case 5:  // one random byte inserted
        s.insert(pos(s), 1, char(rng_() % 256));
        break;
      case 6: {  // swap two lines' worth of text
        if (s.size() < 2) break;
        const size_t a = rng_() % s.size(), b = rng_() % s.size();
        std::swap(s[a], s[b]);
        break;
      }
    }
    return s;
  }
  std::mt19937_64 rng_;
  std::vector<std::string> dict_;
};

struct FuzzStats {
  int parsed = 0, rejected = 0;
  double max_seconds = 0;
  long long max_bytes = 0;
};

// Runs `parse` on `n` mutations of `seeds`. Bounds per input: `max_seconds` and an allocation budget of
// `base_bytes` + `per_byte` x input size (operator new throws past it, which fails the test).
template <class Parse>
FuzzStats fuzz(const std::string& what, const std::vector<std::string>& seeds, int n, uint64_t seed_value,
               Parse parse, const std::vector<std::string>& dictionary = {}, double max_seconds = 1.0,
               long long base_bytes = 16ll << 20, long long per_byte = 256) {
  FuzzStats st;
  for (const auto& s : seeds) {
    EXPECT_NO_THROW(parse(s)) << what << ": the unmutated seed must parse";
  }
  Mutator mut(seed_value, dictionary);
  for (int i = 0; i < n; ++i) {
    const std::string input = mut.mutate(seeds[size_t(i) % seeds.size()]);
    const long long start = tl_live;
    tl_peak = tl_live;
    tl_limit = start + base_bytes + per_byte * static_cast<long long>(input.size());
    const auto t0 = std::chrono::steady_clock::now();
    std::string failure;
    try {
      parse(input);
      ++st.parsed;
    } catch (const trex::Error& e) {
      ++st.rejected;
      if (std::string(e.what()).find("fuzz-input") == std::string::npos)
        failure = std::string("error does not name the source: ") + e.what();
    } catch (const std::bad_alloc&) {
      failure = "allocation budget exceeded (runaway memory)";
    } catch (const std::exception& e) {
      failure = std::string("exception other than trex::Error: ") + e.what();
    }
    tl_limit = 0;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    st.max_seconds = std::max(st.max_seconds, secs);
    st.max_bytes = std::max(st.max_bytes, tl_peak - start);
    if (secs > max_seconds) failure += fmt::format(" took {:.3f} s (bound {} s)", secs, max_seconds);
    if (!failure.empty()) {
      ADD_FAILURE() << what << " mutation " << i << ": " << failure << "\ninput: " << escaped(input);
      return st;
    }
  }
  EXPECT_GT(st.rejected, n / 20) << what << ": the mutations should break many inputs";
  EXPECT_GT(st.parsed, 0) << what << ": some mutations should still parse";
  return st;
}

void report(const char* what, const FuzzStats& st) {
  std::printf("%s: %d parsed, %d rejected, slowest %.4f s, peak %.1f KiB\n", what, st.parsed, st.rejected,
              st.max_seconds, double(st.max_bytes) / 1024.0);
}

}  // namespace

TEST(ParserText, NulAndBinaryBytesAreNamedWithLineAndOffset) {
  EXPECT_FALSE(find_binary_byte("Minimize\n x\nEnd\n\xc3\xa9\t\r\f").has_value());
  const auto nul = find_binary_byte(std::string("ab\ncd\0e", 7));
  ASSERT_TRUE(nul.has_value());
  EXPECT_EQ(nul->offset, 5u);
  EXPECT_EQ(nul->line, 2);
  EXPECT_EQ(nul->column, 3);
  EXPECT_EQ(nul->what, "NUL byte (0x00)");
  EXPECT_EQ(find_binary_byte("x\xff")->what, "invalid UTF-8 byte 0xff");
  EXPECT_EQ(find_binary_byte("\xc3(")->offset, 0u);       // truncated sequence
  EXPECT_EQ(find_binary_byte("\xed\xa0\x80")->offset, 0u);  // UTF-16 surrogate
  EXPECT_EQ(find_binary_byte("\xc0\xaf")->offset, 0u);      // overlong '/'
  EXPECT_EQ(find_binary_byte("a\x1b[0m")->what, "control character 0x1b");
}

TEST(ParserText, OneNulByteIsRejectedByEveryParser) {
  const std::string nul(1, '\0');
  auto expect_named = [](auto&& fn, const char* kind) {
    try {
      fn();
      ADD_FAILURE() << kind << ": NUL input parsed";
    } catch (const trex::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("nul.in:1:1: byte offset 0: NUL byte (0x00)"), std::string::npos) << m;
      EXPECT_NE(m.find(kind), std::string::npos) << m;
    }
  };
  expect_named([&] { read_lp(nul, "nul.in"); }, "LP file");
  expect_named([&] { read_mps(nul, "nul.in"); }, "MPS file");
  expect_named([&] { eval::parse_benchmark(nul, "nul.in", "nul"); }, "benchmark JSONL file");
#ifdef TREX_HAVE_GLPK
  expect_named([&] { check_mathprog_syntax(nul, {}, "nul.in"); }, "MathProg model");
  expect_named([&] { mathprog_to_model(nul, {}, "nul.in"); }, "MathProg model");
#endif
  // The mid-file NUL is reported at its own line and offset.
  try {
    read_lp("Minimize\n x" + nul + "\nEnd\n", "f.lp");
  } catch (const trex::Error& e) {
    EXPECT_NE(std::string(e.what()).find("f.lp:2:3: byte offset 11"), std::string::npos) << e.what();
  }
}

TEST(ParserFuzz, LpReader) {
  std::vector<std::string> seeds{seed("gurobi_style.lp")};
  seeds.push_back(write_lp(read_lp(seeds[0], "seed")));  // the writer's canonical form
  const auto st = fuzz(
      "LP", seeds, 20000, 19, [](const std::string& s) { read_lp(s, "fuzz-input"); },
      {"Minimize", "Maximize", "Subject To", "Bounds", "Generals", "Binaries", "End", "Constant", "x[0]",
       "free", "->", "<-", "sos", "semi"});
  report("LP", st);
}

TEST(ParserFuzz, MpsReader) {
  std::vector<std::string> seeds{seed("mixed.mps")};
  Model linear = read_lp(seed("gurobi_style.lp"), "seed");
  for (auto& r : linear.rows) r.quad.clear();  // MPS carries quadratic objectives only
  seeds.push_back(write_mps(linear));
  const auto st = fuzz(
      "MPS", seeds, 12000, 23, [](const std::string& s) { read_mps(s, "fuzz-input"); },
      {"ROWS", "COLUMNS", "RHS", "RANGES", "BOUNDS", "ENDATA", "QUADOBJ", "QMATRIX", "MARKER", "'INTORG'",
       "'INTEND'", " UP ", " MI ", " FX ", " BV ", " N  ", " E  ", "OBJSENSE", "MAX"});
  report("MPS", st);
}

TEST(ParserFuzz, BenchmarkJsonl) {
  const auto st = fuzz(
      "JSONL", {seed("items.jsonl")}, 12000, 29,
      [](const std::string& s) { eval::parse_benchmark(s, "fuzz-input", "fuzz"); },
      {"null", "true", "[]", "{}", "\"answer\":", "\"extra\":", "\"data\":", "\"reference_lp\":", "\\u0000",
       "\\ud800", "1e999", "[[[[[[[[[[[[[[[[", "]]]]]]]]]]]]]]]]"});
  report("JSONL", st);
}

TEST(ParserFuzz, MathProgTranslator) {
#ifndef TREX_HAVE_GLPK
  GTEST_SKIP() << "MathProg needs GLPK";
#else
  const std::string mod = seed("transport.mod");
  const auto st = fuzz(
      "MathProg", {mod}, 5000, 31, [](const std::string& s) { check_mathprog_syntax(s, {}, "fuzz-input"); },
      {"set", "param", "var", "s.t.", "minimize", "maximize", "sum", "{", "}", "in", "data;", "end;", ":=",
       "1..1e9", "if", "then", "else", "printf", "display", "solve;", "table", "check", "for"});
  report("MathProg", st);
  int count = 0, cpeak = 0;
  size_t total = 0, tpeak = 0;
  glp_mem_usage(&count, &cpeak, &total, &tpeak);
  std::printf("GLPK peak %.1f KiB\n", double(tpeak) / 1024.0);
  EXPECT_LT(tpeak, size_t(64) << 20) << "GLPK's own allocations across the fuzz run";
#endif
}
