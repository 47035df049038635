#include "orkit/solve/result_json.h"

#include "orkit/lp/model_util.h"

namespace trex::orkit {

const char* problem_class(const Model& model) {
  const bool q = model.is_quadratic(), i = model.has_integers();
  return q ? (i ? "MIQP" : "QP") : (i ? "MILP" : "LP");
}

nlohmann::json result_to_json(const Model& model, const SolveResult& result) {
  nlohmann::json j;
  j["status"] = status_name(result.status);
  const bool has_solution = result.values.size() == model.vars.size() && !result.values.empty();
  j["objective"] = has_solution || (model.vars.empty() && result.status == SolveStatus::Optimal)
                       ? nlohmann::json(result.objective)
                       : nlohmann::json(nullptr);
  nlohmann::json values = nlohmann::json::object();
  if (has_solution)
    for (size_t k = 0; k < model.vars.size(); ++k) values[model.vars[k].name] = result.values[k];
  j["values"] = std::move(values);
  j["solver"] = result.solver;
  j["seconds"] = result.seconds;
  j["message"] = result.message;
  j["problem_class"] = problem_class(model);
  j["num_vars"] = model.vars.size();
  j["num_rows"] = model.rows.size();
  return j;
}

nlohmann::json error_json(const std::string& message) {
  return {{"status", "error"}, {"objective", nullptr}, {"values", nlohmann::json::object()}, {"solver", ""},
          {"seconds", 0.0},    {"message", message},   {"problem_class", ""},   {"num_vars", 0},
          {"num_rows", 0}};
}

}  // namespace trex::orkit
