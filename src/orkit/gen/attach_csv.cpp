#include "orkit/gen/attach_csv.h"

#include <fmt/format.h>

#include <map>

#include "core/error.h"
#include "orkit/gen/text.h"

namespace trex::orkit::gen {
namespace {

enum class Kind { Scalar, Names, Tuples, Nested, IndexedSets };

Kind kind_of(const std::string& key, const json& v) {
  if (v.is_number()) return Kind::Scalar;
  if (v.is_array()) return !v.empty() && v[0].is_array() ? Kind::Tuples : Kind::Names;
  TREX_CHECK(v.is_object(), "data key '{}' cannot be written as CSV: {}", key, v.dump().substr(0, 80));
  if (!v.empty() && v.begin()->is_array()) return Kind::IndexedSets;
  return Kind::Nested;
}

// Depth of a nested object of numbers ({a: 1} -> 1); every leaf must sit at the same depth.
int depth_of(const std::string& key, const json& v) {
  if (v.is_number()) return 0;
  if (v.is_object() && v.empty()) return 1;
  TREX_CHECK(v.is_object(), "data key '{}': expected numbers in nested objects", key);
  const int d = depth_of(key, v.begin().value());
  for (auto it = v.begin(); it != v.end(); ++it)
    TREX_CHECK(depth_of(key, it.value()) == d, "data key '{}': entries nest to different depths", key);
  return d + 1;
}

std::string cell(const std::string& s) {
  TREX_CHECK(s.find_first_of(",\"\n") == std::string::npos, "CSV cell '{}' needs quoting", s);
  return s;
}

void nested_rows(const json& v, std::vector<std::string>& prefix, std::string& out) {
  for (auto it = v.begin(); it != v.end(); ++it) {
    prefix.push_back(cell(it.key()));
    if (it->is_number())
      out += join(prefix, ",") + "," + it->dump() + "\n";
    else
      nested_rows(*it, prefix, out);
    prefix.pop_back();
  }
}

std::string key_columns(int depth) {
  std::vector<std::string> c;
  for (int i = 1; i <= depth; ++i) c.push_back(fmt::format("key{}", i));
  return join(c, ",");
}

}  // namespace

std::vector<CsvFile> csv_files(const Instance& inst) {
  std::map<std::string, std::string> described;
  for (const auto& [k, v] : inst.data_keys) described[k] = v;
  std::vector<CsvFile> files;
  CsvFile params{"params.csv", "name,value\n", "scalar parameters, one per row (columns name, value)"};
  bool any_scalar = false;
  for (auto it = inst.data.begin(); it != inst.data.end(); ++it) {
    const std::string& k = it.key();
    const json& v = *it;
    const std::string what = described.count(k) ? described[k] : k;
    switch (kind_of(k, v)) {
      case Kind::Scalar:
        params.text += cell(k) + "," + v.dump() + "\n";
        params.description += fmt::format("; `{}`: {}", k, what);
        any_scalar = true;
        break;
      case Kind::Names: {
        CsvFile f{k + ".csv", "name\n", fmt::format("column name; {}", what)};
        for (const auto& e : v) f.text += cell(e.get<std::string>()) + "\n";
        files.push_back(std::move(f));
        break;
      }
      case Kind::Tuples: {
        std::vector<std::string> cols;
        for (size_t i = 1; i <= v[0].size(); ++i) cols.push_back(fmt::format("c{}", i));
        CsvFile f{k + ".csv", join(cols, ",") + "\n", fmt::format("columns {}; {}", join(cols, ", "), what)};
        for (const auto& e : v) {
          std::vector<std::string> parts;
          for (const auto& p : e) parts.push_back(cell(p.get<std::string>()));
          f.text += join(parts, ",") + "\n";
        }
        files.push_back(std::move(f));
        break;
      }
      case Kind::Nested: {
        const int depth = depth_of(k, v);
        CsvFile f{k + ".csv", key_columns(depth) + ",value\n",
                  fmt::format("columns {}, value; {}", key_columns(depth), what)};
        std::vector<std::string> prefix;
        nested_rows(v, prefix, f.text);
        files.push_back(std::move(f));
        break;
      }
      case Kind::IndexedSets: {
        CsvFile f{k + ".csv", "key1,name\n",
                  fmt::format("columns key1, name (one row per member); {}", what)};
        for (auto s = v.begin(); s != v.end(); ++s)
          for (const auto& e : *s) f.text += cell(s.key()) + "," + cell(e.get<std::string>()) + "\n";
        files.push_back(std::move(f));
        break;
      }
    }
  }
  if (any_scalar) files.insert(files.begin(), std::move(params));
  return files;
}

std::string csv_loader_python(const json& data) {
  std::string py =
      "import csv\n\n\ndef read_rows(path):\n    with open(path, newline=\"\") as f:\n"
      "        return list(csv.DictReader(f))\n\n\n"
      "def number(text):\n    value = float(text)\n    return int(value) if value.is_integer() and \"e\" not "
      "in text "
      "and \".\" not in text else value\n\n\n"
      "def nested(rows, depth):\n    out = {}\n    for r in rows:\n        level = out\n"
      "        for i in range(1, depth):\n            level = level.setdefault(r[f\"key{i}\"], {})\n"
      "        level[r[f\"key{depth}\"]] = number(r[\"value\"])\n    return out\n\n\n"
      "data = {}\n";
  bool scalars = false;
  for (auto it = data.begin(); it != data.end(); ++it) scalars = scalars || it->is_number();
  if (scalars) py += "params = {r[\"name\"]: number(r[\"value\"]) for r in read_rows(\"params.csv\")}\n";
  for (auto it = data.begin(); it != data.end(); ++it) {
    const std::string& k = it.key();
    const std::string file = k + ".csv";
    switch (kind_of(k, *it)) {
      case Kind::Scalar:
        py += fmt::format("data[\"{0}\"] = params[\"{0}\"]\n", k);
        break;
      case Kind::Names:
        py += fmt::format("data[\"{}\"] = [r[\"name\"] for r in read_rows(\"{}\")]\n", k, file);
        break;
      case Kind::Tuples: {
        std::vector<std::string> cols;
        for (size_t i = 1; i <= (*it)[0].size(); ++i) cols.push_back(fmt::format("r[\"c{}\"]", i));
        py += fmt::format("data[\"{}\"] = [[{}] for r in read_rows(\"{}\")]\n", k, join(cols, ", "), file);
        break;
      }
      case Kind::Nested:
        py += fmt::format("data[\"{}\"] = nested(read_rows(\"{}\"), {})\n", k, file, depth_of(k, *it));
        break;
      case Kind::IndexedSets:
        py += fmt::format(
            "data[\"{}\"] = {{}}\nfor r in read_rows(\"{}\"):\n    data[\"{}\"].setdefault(r[\"key1\"], "
            "[]).append(r[\"name\"])\n",
            k, file, k);
        break;
    }
  }
  return py;
}

}  // namespace trex::orkit::gen
