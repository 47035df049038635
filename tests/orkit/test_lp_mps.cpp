// MPS reader/writer, and the acceptance of our LP/MPS output by the reference binaries (glpsol, cbc)
// when they are installed: the objective they report must equal ours.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <regex>

#include "core/error.h"
#include "core/files.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"
#include "orkit/lp/mps_format.h"
#include "orkit/solve/solve.h"

using namespace trex::orkit;
namespace fs = std::filesystem;

namespace {

const char* kMixedLp = R"(Maximize
 obj: 3 x[0] + 2 y - 0.5 z + 4 b + 7
Subject To
 c1: x[0] + y + z <= 10
 c2: x[0] - y >= -2.5
 c3: y + 2 z = 6
 c4: 2 <= x[0] + b <= 9
Bounds
 -5 <= z <= 4
 y <= 5.5
 x[0] <= 7
Generals
 x[0]
Binaries
 b
End
)";

std::string run_capture(const std::string& cmd) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return out;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p.get())) > 0) out.append(buf, got);
  return out;
}

bool have_binary(const char* name) {
  return std::system((std::string("command -v ") + name + " >/dev/null 2>&1").c_str()) == 0;
}

fs::path temp_path(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("trex-test-lp-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

// glpsol prints "Objective:  obj = 16 (MAXimum)".
double glpsol_objective(const std::string& out) {
  std::smatch m;
  if (std::regex_search(out, m, std::regex(R"(Objective:\s+\S+\s*=\s*([-+0-9.eE]+))"))) return std::stod(m[1]);
  return NAN;
}
// cbc prints "Objective value:  16.000" (MIP) or "Optimal - objective value 16" (LP).
double cbc_objective(const std::string& out) {
  std::smatch m;
  if (std::regex_search(out, m, std::regex(R"(Objective value:\s+([-+0-9.eE]+))"))) return std::stod(m[1]);
  if (std::regex_search(out, m, std::regex(R"(objective value\s+([-+0-9.eE]+))"))) return std::stod(m[1]);
  return NAN;
}

}  // namespace

TEST(Mps, WriteReadRoundTrip) {
  const Model m = read_lp(kMixedLp);
  const Model back = read_mps(write_mps(m), "rt.mps");
  ASSERT_EQ(back.vars.size(), m.vars.size());
  ASSERT_EQ(back.rows.size(), m.rows.size());
  EXPECT_EQ(back.sense, Sense::Maximize);
  EXPECT_EQ(back.objective_constant, 7.0);
  for (size_t j = 0; j < m.vars.size(); ++j) {
    EXPECT_EQ(back.vars[j].name, m.vars[j].name);
    EXPECT_EQ(back.vars[j].lb, m.vars[j].lb) << m.vars[j].name;
    EXPECT_EQ(back.vars[j].ub, m.vars[j].ub) << m.vars[j].name;
    EXPECT_EQ(back.vars[j].type, m.vars[j].type) << m.vars[j].name;
  }
  for (size_t i = 0; i < m.rows.size(); ++i) {
    EXPECT_EQ(back.rows[i].name, m.rows[i].name);
    EXPECT_EQ(back.rows[i].sense, m.rows[i].sense);
    EXPECT_EQ(back.rows[i].rhs, m.rows[i].rhs);
    EXPECT_EQ(back.rows[i].lin.size(), m.rows[i].lin.size());
  }
  // Same optimum either way.
  const SolveResult a = solve(m), b = solve(back);
  ASSERT_EQ(a.status, SolveStatus::Optimal);
  ASSERT_EQ(b.status, SolveStatus::Optimal);
  EXPECT_NEAR(a.objective, b.objective, 1e-9 * std::abs(a.objective));
}

TEST(Mps, ReadsFixedFormatWithRangesNegativeUpperAndQuadobj) {
  // Classic fixed-column file: blank RHS/BOUNDS set names, RANGES, a negative UP bound without LO
  // (lower bound becomes -inf), integer markers and a QUADOBJ section.
  const char* text =
      "NAME          TESTLP\n"
      "ROWS\n"
      " N  COST\n"
      " L  LIM1\n"
      " G  LIM2\n"
      " E  MYEQN\n"
      "COLUMNS\n"
      "    X1        COST         1.0   LIM1         1.0\n"
      "    X1        LIM2         1.0\n"
      "    MARKER    'MARKER'     'INTORG'\n"
      "    X2        COST         2.0   LIM1         1.0\n"
      "    X2        MYEQN       -1.0\n"
      "    MARKER    'MARKER'     'INTEND'\n"
      "    X3        COST        -1.0   MYEQN        1.0\n"
      "RHS\n"
      "    RHS       COST        -5.0\n"
      "    RHS       LIM1         4.0   LIM2         1.0\n"
      "    RHS       MYEQN        7.0\n"
      "RANGES\n"
      "    RNG       LIM1         2.5\n"
      "BOUNDS\n"
      " UP BND       X1           4.0\n"
      " UP           X3          -1.0\n"
      " BV BND       X2\n"
      "QUADOBJ\n"
      "    X1        X1           2.0\n"
      "    X1        X3           3.0\n"
      "ENDATA\n";
  const Model m = read_mps(text, "fixed.mps");
  EXPECT_EQ(m.name, "TESTLP");
  EXPECT_EQ(m.objective_constant, 5.0);
  ASSERT_EQ(m.vars.size(), 3u);
  EXPECT_EQ(m.vars[0].ub, 4.0);
  EXPECT_EQ(m.vars[1].type, VarType::Binary);
  EXPECT_EQ(m.vars[2].lb, -kInf);
  EXPECT_EQ(m.vars[2].ub, -1.0);
  ASSERT_EQ(m.rows.size(), 4u);  // LIM1 ranged -> LIM1 (>= 1.5) and LIM1_hi (<= 4)
  EXPECT_EQ(m.rows[0].name, "LIM1");
  EXPECT_EQ(m.rows[0].sense, RowSense::GE);
  EXPECT_EQ(m.rows[0].rhs, 1.5);
  EXPECT_EQ(m.rows[1].name, "LIM1_hi");
  EXPECT_EQ(m.rows[1].rhs, 4.0);
  EXPECT_EQ(m.rows[3].rhs, 7.0);
  ASSERT_EQ(m.objective_quad.size(), 2u);
  EXPECT_EQ(m.objective_quad[0].coef, 1.0);  // 0.5 * 2 x1^2
  EXPECT_EQ(m.objective_quad[1].coef, 3.0);  // lower-triangle entry: 3 x1 x3
  // The writer's QUADOBJ reads back to the same quadratic.
  const Model back = read_mps(write_mps(m));
  ASSERT_EQ(back.objective_quad.size(), 2u);
  EXPECT_EQ(back.objective_quad[0].coef, 1.0);
  EXPECT_EQ(back.objective_quad[1].coef, 3.0);
}

TEST(Mps, ErrorsNameTheLine) {
  try {
    read_mps("NAME x\nROWS\n N obj\n Q bad\nENDATA\n", "e.mps");
    FAIL() << "no error";
  } catch (const trex::Error& e) {
    EXPECT_NE(std::string(e.what()).find("e.mps:4:"), std::string::npos) << e.what();
  }
  try {
    read_mps("NAME x\nROWS\n N obj\nCOLUMNS\n x obj 1\nBOUNDS\n SC BND x 3\nENDATA\n", "e.mps");
    FAIL() << "no error";
  } catch (const trex::Error& e) {
    EXPECT_NE(std::string(e.what()).find("e.mps:7:"), std::string::npos) << e.what();
  }
}

TEST(ExternalSolvers, GlpsolAndCbcReadOurLpAndMps) {
  const bool glpsol = have_binary("glpsol"), cbc = have_binary("cbc");
  if (!glpsol && !cbc) GTEST_SKIP() << "neither glpsol nor cbc installed";
  // Gurobi-style names (x[0]) need portable names for glpsol; the constant goes in as `Constant`.
  const Model m = read_lp(kMixedLp);
  const SolveResult ours = solve(m);
  ASSERT_EQ(ours.status, SolveStatus::Optimal);
  LpWriteOptions portable;
  portable.portable_names = true;
  const fs::path lp = temp_path("mixed.lp"), mps = temp_path("mixed.mps");
  write_lp_file(m, lp, portable);
  MpsWriteOptions no_objsense;  // glpsol rejects OBJSENSE, cbc ignores it: write min of -objective
  no_objsense.objsense_section = false;
  write_mps_file(m, mps, no_objsense);
  const double tol = 1e-6 * std::max(1.0, std::abs(ours.objective));
  if (glpsol) {
    const std::string out_lp = run_capture("glpsol --lp " + lp.string() + " -o /dev/stdout 2>&1");
    EXPECT_NEAR(glpsol_objective(out_lp), ours.objective, tol) << out_lp;
    const std::string out_mps = run_capture("glpsol --freemps " + mps.string() + " -o /dev/stdout 2>&1");
    EXPECT_NEAR(glpsol_objective(out_mps), -ours.objective, tol) << out_mps;
  }
  if (cbc) {
    const std::string out_lp = run_capture("cbc " + lp.string() + " -solve -quit 2>&1");
    EXPECT_NEAR(cbc_objective(out_lp), ours.objective, tol) << out_lp;
    // cbc reads the default (bracketed) names too.
    const fs::path raw = temp_path("mixed_raw.lp");
    write_lp_file(m, raw);
    const std::string out_raw = run_capture("cbc " + raw.string() + " -solve -quit 2>&1");
    EXPECT_NEAR(cbc_objective(out_raw), ours.objective, tol) << out_raw;
    const std::string out_mps = run_capture("cbc " + mps.string() + " -solve -quit 2>&1");
    EXPECT_NEAR(cbc_objective(out_mps), -ours.objective, tol) << out_mps;
  }
  fs::remove_all(lp.parent_path());
}
