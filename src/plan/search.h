// Layout search: enumerate TP/PP/VPP/EP/ETP/CP, micro-batch, recomputation and offload for a device
// count, keep what the planner accepts and what fits in memory, rank by predicted MFU.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/estimate.h"

namespace trex::plan {

struct SearchResult {
  std::vector<Estimate> best;  // fitting layouts, highest MFU first
  int64_t considered = 0, refused = 0, out_of_memory = 0;
};

// accept (optional): only layouts it accepts are estimated (e.g. those a trainer runs today); the others count as
// refused.
SearchResult search_layouts(const Estimator& est, int64_t devices, size_t keep = 10, bool progress = true,
                            const std::function<bool(const Layout&)>& accept = {});

// Text table, JSON and a self-contained HTML page (inline SVG bars) of a set of estimates.
std::string estimates_table(const std::vector<Estimate>& rows);
nlohmann::json estimate_to_json(const Estimate& e);
std::string estimates_html(const std::vector<Estimate>& rows, const std::string& title);

}  // namespace trex::plan
