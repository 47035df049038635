// A strict parser for the YAML subset the project's configs use, producing JSON:
//   block mappings (key: value, key: + indented block), block lists (- item, - key: value ...),
//   flow lists [a, b, "c"] and flow mappings {a: 1, b: x} (one line), scalars (plain, "double" with
//   escapes, 'single'), numbers, true/false, null/~, comments (# to end of line outside quotes).
// Not supported (an error naming file:line): tabs for indentation, anchors/aliases, tags, multi-line
// scalars (| >), multiple documents, duplicate keys.
#pragma once
#include <filesystem>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace trex::train {

nlohmann::json parse_yaml(std::string_view text, const std::string& filename);
// .json -> JSON parser; anything else -> the YAML subset.
nlohmann::json read_config_file(const std::filesystem::path& path);

}  // namespace trex::train
