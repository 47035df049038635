// The HTML report of a generation run, rendered from stats.json (counts, histograms as bars,
// rejection reasons, decontamination).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace trex::orkit::gen {

std::string html_report(const nlohmann::ordered_json& stats);

}  // namespace trex::orkit::gen
