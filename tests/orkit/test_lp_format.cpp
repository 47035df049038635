// CPLEX LP reader/writer: every construct of the language, round trips, and line-numbered errors.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>

#include "core/error.h"
#include "orkit/lp/lp_format.h"
#include "orkit/lp/model_util.h"

using namespace trex::orkit;

namespace {

double lin_coef(const std::vector<LinTerm>& lin, int var) {
  double c = 0.0;
  for (const auto& t : lin)
    if (t.var == var) c += t.coef;
  return c;
}
double quad_coef(const std::vector<QuadTerm>& quad, int i, int j) {
  double c = 0.0;
  for (const auto& q : quad)
    if ((q.i == i && q.j == j) || (q.i == j && q.j == i)) c += q.coef;
  return c;
}
const Constraint& row(const Model& m, const char* name) {
  const int i = find_row(m, name);
  EXPECT_GE(i, 0) << "no row " << name;
  return m.rows.at(i < 0 ? 0 : i);
}
const Variable& var(const Model& m, const char* name) {
  const int j = find_var(m, name);
  EXPECT_GE(j, 0) << "no variable " << name;
  return m.vars.at(j < 0 ? 0 : j);
}

// Two models are the same up to term order: same vars (name, bounds, type), same rows, same objective.
void expect_same_model(const Model& a, const Model& b) {
  ASSERT_EQ(a.vars.size(), b.vars.size());
  ASSERT_EQ(a.rows.size(), b.rows.size());
  EXPECT_EQ(a.sense, b.sense);
  EXPECT_EQ(a.objective_constant, b.objective_constant);
  for (size_t j = 0; j < a.vars.size(); ++j) {
    const int k = find_var(b, a.vars[j].name);
    ASSERT_GE(k, 0) << a.vars[j].name;
    EXPECT_EQ(a.vars[j].lb, b.vars[k].lb) << a.vars[j].name;
    EXPECT_EQ(a.vars[j].ub, b.vars[k].ub) << a.vars[j].name;
    EXPECT_EQ(a.vars[j].type, b.vars[k].type) << a.vars[j].name;
    EXPECT_EQ(lin_coef(a.objective, j), lin_coef(b.objective, k));
  }
  auto map = [&](int j) { return find_var(b, a.vars[j].name); };
  for (const auto& q : a.objective_quad) EXPECT_EQ(q.coef, quad_coef(b.objective_quad, map(q.i), map(q.j)));
  EXPECT_EQ(a.objective_quad.size(), b.objective_quad.size());
  for (size_t i = 0; i < a.rows.size(); ++i) {
    const Constraint& ra = a.rows[i];
    const Constraint& rb = b.rows[i];
    EXPECT_EQ(ra.name, rb.name);
    EXPECT_EQ(ra.sense, rb.sense) << ra.name;
    EXPECT_EQ(ra.rhs, rb.rhs) << ra.name;
    ASSERT_EQ(ra.lin.size(), rb.lin.size()) << ra.name;
    for (const auto& t : ra.lin) EXPECT_EQ(t.coef, lin_coef(rb.lin, map(t.var))) << ra.name;
    ASSERT_EQ(ra.quad.size(), rb.quad.size()) << ra.name;
    for (const auto& q : ra.quad) EXPECT_EQ(q.coef, quad_coef(rb.quad, map(q.i), map(q.j))) << ra.name;
  }
}

std::string error_of(const std::string& text) {
  try {
    read_lp(text, "bad.lp");
  } catch (const trex::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(LpReader, ObjectiveRowsBoundsAndTypes) {
  const Model m = read_lp(R"(\ a comment line
Maximize
 profit: 3 x + 2.5e1 y
   - z + 4
Subject To
 c1: x + y <= 4
 c2: 2 x + 3 y >= 1E-3
 x - y = 0.5
 c4: 3 + x =< 10 - y
 c5: x => 1
 c6: y > -2
 c7: z < 7
Bounds
 y free
 -inf <= z <= +inf
 x >= -3
 2 <= w <= 5
 v = 4
 u <= INFINITY
 t >= -Infinity
Generals
 w
Binaries
 b
End
)");
  EXPECT_EQ(m.sense, Sense::Maximize);
  EXPECT_EQ(m.objective_constant, 4.0);
  EXPECT_EQ(lin_coef(m.objective, find_var(m, "x")), 3.0);
  EXPECT_EQ(lin_coef(m.objective, find_var(m, "y")), 25.0);
  EXPECT_EQ(lin_coef(m.objective, find_var(m, "z")), -1.0);
  ASSERT_EQ(m.rows.size(), 7u);
  EXPECT_EQ(row(m, "c1").sense, RowSense::LE);
  EXPECT_EQ(row(m, "c2").rhs, 1e-3);
  EXPECT_EQ(row(m, "c2").sense, RowSense::GE);
  // The third row is unnamed: auto-named after its index, as Gurobi does.
  EXPECT_EQ(m.rows[2].name, "R2");
  EXPECT_EQ(m.rows[2].sense, RowSense::EQ);
  EXPECT_EQ(lin_coef(m.rows[2].lin, find_var(m, "y")), -1.0);
  // Constants and variables on both sides: 3 + x <= 10 - y  ->  x + y <= 7.
  EXPECT_EQ(row(m, "c4").rhs, 7.0);
  EXPECT_EQ(lin_coef(row(m, "c4").lin, find_var(m, "y")), 1.0);
  EXPECT_EQ(row(m, "c5").sense, RowSense::GE);
  EXPECT_EQ(row(m, "c6").rhs, -2.0);
  EXPECT_EQ(row(m, "c7").sense, RowSense::LE);
  EXPECT_EQ(var(m, "y").lb, -kInf);
  EXPECT_EQ(var(m, "y").ub, kInf);
  EXPECT_EQ(var(m, "z").lb, -kInf);
  EXPECT_EQ(var(m, "x").lb, -3.0);
  EXPECT_EQ(var(m, "w").lb, 2.0);
  EXPECT_EQ(var(m, "w").ub, 5.0);
  EXPECT_EQ(var(m, "w").type, VarType::Integer);
  EXPECT_EQ(var(m, "v").lb, 4.0);
  EXPECT_EQ(var(m, "v").ub, 4.0);
  EXPECT_EQ(var(m, "u").ub, kInf);
  EXPECT_EQ(var(m, "t").lb, -kInf);
  EXPECT_EQ(var(m, "b").type, VarType::Binary);
  EXPECT_EQ(var(m, "b").ub, 1.0);
}

TEST(LpReader, KeywordSpellingsAndImplicitCoefficients) {
  for (const char* sense : {"minimize", "MINIMUM", "min", "Minimise"}) {
    for (const char* st : {"subject to", "SUCH THAT", "st", "s.t."}) {
      const std::string text = std::string(sense) + "\n obj: - x - -2 y\n" + st +
                               "\n x + y >= 1\nbound\n x <= 10\ngeneral\n y\nbin\n z\nend\n";
      const Model m = read_lp(text);
      EXPECT_EQ(m.sense, Sense::Minimize) << text;
      EXPECT_EQ(lin_coef(m.objective, find_var(m, "x")), -1.0) << text;
      EXPECT_EQ(lin_coef(m.objective, find_var(m, "y")), 2.0) << text;
      EXPECT_EQ(var(m, "x").ub, 10.0);
      EXPECT_EQ(var(m, "y").type, VarType::Integer);
      EXPECT_EQ(var(m, "z").type, VarType::Binary);
    }
  }
  for (const char* sense : {"maximize", "Maximum", "MAX", "maximise"})
    EXPECT_EQ(read_lp(std::string(sense) + "\n x\nst\n x <= 1\nend\n").sense, Sense::Maximize);
}

TEST(LpReader, MultiLineExpressionsAndUnnamedRowsAcrossLines) {
  const Model m = read_lp(R"(min
 obj:
   x1 + 2 x2
   + 3 x3
subject to
 first: x1 + x2
   + x3 >= 2
 x1 - x2 <= 3
 - x1 + x3 <= 4
 3x1+2x2<=7
 .5 x3 >= 0.25
end)");
  ASSERT_EQ(m.rows.size(), 5u);
  EXPECT_EQ(m.rows[0].lin.size(), 3u);
  EXPECT_EQ(m.rows[1].name, "R1");
  EXPECT_EQ(m.rows[1].rhs, 3.0);
  EXPECT_EQ(m.rows[2].name, "R2");
  EXPECT_EQ(lin_coef(m.rows[2].lin, find_var(m, "x1")), -1.0);
  EXPECT_EQ(lin_coef(m.rows[3].lin, find_var(m, "x1")), 3.0);
  EXPECT_EQ(m.rows[3].rhs, 7.0);
  EXPECT_EQ(lin_coef(m.rows[4].lin, find_var(m, "x3")), 0.5);
  EXPECT_EQ(lin_coef(m.objective, find_var(m, "x3")), 3.0);
}

TEST(LpReader, DuplicateTermsAreMerged) {
  const Model m = read_lp("min\n x + x + 2 y - y\nst\n c: x + 2 x - x <= 4\nend\n");
  EXPECT_EQ(m.objective.size(), 2u);
  EXPECT_EQ(lin_coef(m.objective, 0), 2.0);
  EXPECT_EQ(lin_coef(m.objective, 1), 1.0);
  EXPECT_EQ(m.rows[0].lin.size(), 1u);
  EXPECT_EQ(lin_coef(m.rows[0].lin, 0), 2.0);
}

TEST(LpReader, RangedRows) {
  const Model m = read_lp("min\n x + y\nst\n r1: 2 <= x + y <= 5\n r2: 7 >= x - y >= -1\n r3: 3 <= x <= 3\nend\n");
  ASSERT_EQ(m.rows.size(), 5u);
  EXPECT_EQ(row(m, "r1").sense, RowSense::GE);
  EXPECT_EQ(row(m, "r1").rhs, 2.0);
  EXPECT_EQ(row(m, "r1_hi").sense, RowSense::LE);
  EXPECT_EQ(row(m, "r1_hi").rhs, 5.0);
  EXPECT_EQ(row(m, "r2").rhs, -1.0);
  EXPECT_EQ(row(m, "r2_hi").rhs, 7.0);
  EXPECT_EQ(row(m, "r3").sense, RowSense::EQ);
  EXPECT_EQ(row(m, "r3").rhs, 3.0);
}

TEST(LpReader, QuadraticObjectiveAndRows) {
  const Model m = read_lp(R"(Minimize
 obj: 2 x + [ 4 x ^ 2 + 2 x * y - 6 y^2 ] / 2 + 1.5
Subject To
 q1: x + [ x ^ 2 + 3 x * y ] <= 10
 q2: [ - y * x ] >= -4
End
)");
  const int x = find_var(m, "x"), y = find_var(m, "y");
  EXPECT_EQ(quad_coef(m.objective_quad, x, x), 2.0);
  EXPECT_EQ(quad_coef(m.objective_quad, x, y), 1.0);
  EXPECT_EQ(quad_coef(m.objective_quad, y, y), -3.0);
  EXPECT_EQ(m.objective_constant, 1.5);
  EXPECT_EQ(quad_coef(row(m, "q1").quad, x, x), 1.0);
  EXPECT_EQ(quad_coef(row(m, "q1").quad, x, y), 3.0);
  EXPECT_EQ(lin_coef(row(m, "q1").lin, x), 1.0);
  EXPECT_EQ(quad_coef(row(m, "q2").quad, x, y), -1.0);
  EXPECT_TRUE(m.is_quadratic());
}

TEST(LpReader, GurobiStyleFile) {
  // The shape of Gurobi's LP writer output: bracketed names, 16-digit coefficients, the `Constant`
  // pseudo-variable, quadratic bracket with `/ 2`, auto-named rows, Generals/Binaries.
  const char* text = R"(\ Model Cutting Stock
\ LP format - for model browsing. Use MPS format to capture full model detail.
Minimize
  - 303.5667516545933 x[0] - 269.5219930122017 x[1] + [ 385.4414334580377 x[0] * x[1]
   + 2 x[1] ^ 2 ] / 2 + 6504.640840713876 Constant
Subject To
 R0: 303.5667516545933 x[0] + 269.5219930122017 x[1] <= 6504.640840713876
 R1: x[0] >= 3
 max_purity_4: - 1.5664279467186848e-04 x[0] >= 0
 qc0: [ x[0] * y[1,2] ] = 0
Bounds
 x[1] free
 Constant = 1
Generals
 x[0]
Binaries
 y[1,2]
End
)";
  const Model m = read_lp(text);
  EXPECT_EQ(find_var(m, "Constant"), -1);
  EXPECT_EQ(m.objective_constant, 6504.640840713876);
  EXPECT_EQ(m.vars.size(), 3u);
  const int x0 = find_var(m, "x[0]"), x1 = find_var(m, "x[1]"), y = find_var(m, "y[1,2]");
  ASSERT_GE(x0, 0);
  ASSERT_GE(x1, 0);
  ASSERT_GE(y, 0);
  EXPECT_EQ(lin_coef(m.objective, x0), -303.5667516545933);
  EXPECT_EQ(quad_coef(m.objective_quad, x0, x1), 385.4414334580377 / 2);
  EXPECT_EQ(quad_coef(m.objective_quad, x1, x1), 1.0);
  EXPECT_EQ(lin_coef(row(m, "max_purity_4").lin, x0), -1.5664279467186848e-04);
  EXPECT_EQ(var(m, "x[1]").lb, -kInf);
  EXPECT_EQ(var(m, "x[0]").type, VarType::Integer);
  EXPECT_EQ(var(m, "y[1,2]").type, VarType::Binary);
  EXPECT_EQ(quad_coef(row(m, "qc0").quad, x0, y), 1.0);

  LpReadOptions keep;
  keep.fold_constant_variable = false;
  const Model raw = read_lp(text, "g.lp", keep);
  ASSERT_GE(find_var(raw, "Constant"), 0);
  EXPECT_EQ(raw.objective_constant, 0.0);
  EXPECT_EQ(var(raw, "Constant").lb, 1.0);
}

TEST(LpReader, BlockCommentsAndEmptyObjective) {
  const Model m = read_lp("\\* a block\ncomment *\\\nMinimize\nSubject To\n c: x >= 1 \\ trailing\nEnd\n");
  EXPECT_TRUE(m.objective.empty());
  ASSERT_EQ(m.rows.size(), 1u);
  EXPECT_EQ(m.rows[0].rhs, 1.0);
}

TEST(LpReader, ErrorsNameTheLine) {
  auto expect_error = [](const std::string& text, const std::string& where, const std::string& what) {
    const std::string e = error_of(text);
    EXPECT_NE(e.find(where), std::string::npos) << "error '" << e << "' lacks '" << where << "'";
    EXPECT_NE(e.find(what), std::string::npos) << "error '" << e << "' lacks '" << what << "'";
  };
  expect_error("Minimize\n x\nSubject To\n c1: x + y 3\nEnd\n", "bad.lp:4:", "expected '+', '-'");
  expect_error("Minimize\n x\nSubject To\n c1: x + y\n\n c2: x <= 1\nEnd\n", "bad.lp:6:", "expected a relation");
  expect_error("Minimize\n x\nSubject To\n c1: x <=\nBounds\nEnd\n", "bad.lp:4:", "right-hand side");
  expect_error("Minimize\n x\nSubject To\n c1: x <= 1\nBounds\n x <= abc\nEnd\n", "bad.lp:6:",
               "expected a number");
  expect_error("Minimize\n x\nSubject To\n c1: x <= 1\nSemi-continuous\n x\nEnd\n", "bad.lp:5:",
               "semi-continuous");
  expect_error("Minimize\n x + [ x ^ 3 ] / 2\nSubject To\nEnd\n", "bad.lp:2:", "only squares");
  expect_error("Minimize\n x + [ x * y\nSubject To\n c: x <= 1\nEnd\n", "bad.lp:2:", "never closed");
  expect_error("Minimize\n x + [ 2 x ] / 2\nst\nend\n", "bad.lp:2:", "linear terms go outside");
  expect_error("x + y\n", "bad.lp:1:", "expected 'Minimize' or 'Maximize'");
  expect_error("Minimize\n x\nSubject To\n c: b = 1 -> x <= 3\nEnd\n", "bad.lp:4:", "indicator");
  expect_error("Minimize\n x\nSubject To\n c1: x <= 1\nSOS\n s1: x:1\nEnd\n", "bad.lp:5:", "SOS");
  expect_error("Minimize\n x\nSubject To\n c1: 2 <= x <= 1\nEnd\n", "bad.lp:4:", "empty range");
  expect_error("Minimize\n x\nSubject To\n c1: x <= 1\nGenerals\n 3\nEnd\n", "bad.lp:6:", "Generals");
  expect_error("Minimize\n x >= 2\nEnd\n", "bad.lp:2:", "relation");
  expect_error("", "bad.lp", "empty LP");
}

TEST(LpWriter, RoundTripEveryConstruct) {
  Model m;
  m.name = "round trip";
  m.sense = Sense::Maximize;
  m.objective_constant = -12.25;
  m.vars = {{"x[0]", 0, kInf, VarType::Continuous},  {"y", -kInf, kInf, VarType::Continuous},
            {"z", -3.5, 7, VarType::Integer},         {"b", 0, 1, VarType::Binary},
            {"f", 4, 4, VarType::Continuous},         {"n", -kInf, -2, VarType::Continuous},
            {"g", 0, -1, VarType::Continuous},        {"h", 1e-7, kInf, VarType::Integer}};
  m.objective = {{0, 0.1}, {1, -1.0 / 3.0}, {2, 1e-17}, {3, 6.02214076e23}};
  m.objective_quad = {{0, 0, 2.5}, {0, 1, -1.0}};
  m.rows.push_back({"c1", {{0, 1}, {1, -1}}, {}, RowSense::LE, 4});
  m.rows.push_back({"c2", {{2, 3}, {3, 1.0000000000000002}}, {}, RowSense::GE, -1e-300});
  m.rows.push_back({"c3", {{4, 1}}, {{0, 1, 2.0}, {1, 1, -1}}, RowSense::EQ, 0});
  m.rows.push_back({"", {{5, 1}}, {}, RowSense::LE, 3});
  m.rows.push_back({"empty", {}, {}, RowSense::LE, 1});
  // A long row forces wrapping.
  Constraint wide{"wide", {}, {}, RowSense::GE, 123.456};
  for (int k = 0; k < 40; ++k) wide.lin.push_back({k % 8, 1.0 + k});
  merge_duplicate_terms(wide.lin);
  m.rows.push_back(wide);

  const std::string text = write_lp(m);
  const Model back = read_lp(text, "written.lp");
  Model expected = m;
  expected.rows[3].name = "R3";
  expected.rows[4].lin = {{0, 0.0}};  // an empty row is written with a 0 coefficient
  expect_same_model(expected, back);
  // Writing the read model again gives the same text: the output is canonical.
  Model named = back;
  named.name = m.name;
  EXPECT_EQ(write_lp(named), text);

  // The literal-constant style also reads back.
  LpWriteOptions literal;
  literal.constant_as_variable = false;
  EXPECT_EQ(read_lp(write_lp(m, literal)).objective_constant, -12.25);
}

TEST(LpWriter, NamesAreCleanedAndKeptUnique) {
  Model m;
  m.vars = {{"a b", 0, kInf}, {"a_b", 0, kInf}, {"2x", 0, kInf}, {"x[1]", 0, kInf}, {"free", 0, kInf},
            {"e12", 0, kInf}, {"p:q", 0, kInf}, {"Constant", 1, 2}};
  for (int j = 0; j < 8; ++j) m.objective.push_back({j, 1.0});
  m.objective_constant = 3;
  m.rows.push_back({"st", {{0, 1}}, {}, RowSense::LE, 1});
  const Model back = read_lp(write_lp(m));
  ASSERT_EQ(back.vars.size(), 9u);  // the constant gets its own fixed pseudo-variable (name taken)
  std::set<std::string> names;
  for (const auto& v : back.vars) names.insert(v.name);
  EXPECT_EQ(names.size(), 9u);
  EXPECT_GE(find_var(back, "x[1]"), 0);
  LpWriteOptions portable;
  portable.portable_names = true;
  const std::string p = write_lp(m, portable);
  EXPECT_EQ(p.find('['), std::string::npos);
  const Model pb = read_lp(p);
  EXPECT_GE(find_var(pb, "x(1)"), 0);
  // The objective constant survives either way (as a fixed variable when `Constant` is taken).
  std::vector<double> at_lb;
  for (const auto& v : pb.vars) at_lb.push_back(std::isfinite(v.lb) ? v.lb : 0.0);
  std::vector<double> m_lb;
  for (const auto& v : m.vars) m_lb.push_back(v.lb);
  EXPECT_DOUBLE_EQ(objective_value(pb, at_lb), objective_value(m, m_lb));
}

TEST(LpWriter, RandomModelsRoundTripExactly) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(-1e6, 1e6);
  std::uniform_int_distribution<int> pick(0, 9);
  for (int trial = 0; trial < 50; ++trial) {
    Model m;
    m.sense = trial % 2 ? Sense::Maximize : Sense::Minimize;
    const int n = 1 + pick(rng);
    for (int j = 0; j < n; ++j) {
      Variable v;
      v.name = "v[" + std::to_string(j) + "]";
      const int kind = pick(rng);
      if (kind < 2) v.lb = -kInf;
      else if (kind < 4) v.lb = u(rng) / 7;
      if (kind % 3 == 0) v.ub = std::max(v.lb, 0.0) + std::abs(u(rng));
      v.type = kind == 9 ? VarType::Integer : VarType::Continuous;
      m.vars.push_back(v);
      if (pick(rng) < 7) m.objective.push_back({j, u(rng) * std::pow(10.0, pick(rng) - 5)});
    }
    const int rows = pick(rng);
    for (int i = 0; i < rows; ++i) {
      Constraint r;
      r.name = "r" + std::to_string(i);
      for (int j = 0; j < n; ++j)
        if (pick(rng) < 5) r.lin.push_back({j, u(rng)});
      if (r.lin.empty()) r.lin.push_back({0, 1.0});
      r.sense = static_cast<RowSense>(pick(rng) % 3);
      r.rhs = u(rng);
      m.rows.push_back(r);
    }
    m.objective_constant = pick(rng) < 3 ? u(rng) : 0.0;
    expect_same_model(m, read_lp(write_lp(m)));
  }
}

TEST(LpFormat, NumbersRoundTripBitExactly) {
  for (double v : {0.1, 1.0 / 3.0, 6504.640840713876, 1e-300, 1.7976931348623157e308, 123456789012345678.0,
                   -2.5e-7, 5e-324}) {
    const std::string s = format_number(v);
    EXPECT_EQ(std::strtod(s.c_str(), nullptr), v) << s;
  }
  EXPECT_EQ(format_number(kInf), "inf");
  EXPECT_EQ(format_number(-kInf), "-inf");
}
