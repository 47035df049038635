#include "optim/param_groups.h"

#include "core/error.h"

namespace trex::optim {

std::string_view group_name(ParamGroup g) {
  switch (g) {
    case ParamGroup::Muon: return "muon";
    case ParamGroup::AdamW: return "adamw";
    case ParamGroup::Frozen: return "frozen";
    case ParamGroup::Buffer: return "buffer";
  }
  return "?";
}

ParamGroup parse_group(std::string_view s) {
  if (s == "muon") return ParamGroup::Muon;
  if (s == "adamw") return ParamGroup::AdamW;
  if (s == "frozen") return ParamGroup::Frozen;
  if (s == "buffer") return ParamGroup::Buffer;
  fail("unknown parameter group '{}' (expected muon, adamw, frozen or buffer)", s);
}

static bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

static std::string_view last_component(std::string_view name) {
  auto p = name.rfind('.');
  return p == std::string_view::npos ? name : name.substr(p + 1);
}

ParamGroup dsv4_param_group(std::string_view name, const Shape& shape) {
  if (ends_with(name, "gate.bias") || ends_with(name, "gate.tid2eid")) return ParamGroup::Buffer;
  if (name == "embed.weight" || name == "head.weight") return ParamGroup::AdamW;
  // Norm weights: norm.weight, attn_norm, ffn_norm, q_norm, kv_norm, compressor.norm, enorm, hnorm.
  if (ends_with(name, "norm.weight")) return ParamGroup::AdamW;
  std::string_view leaf = last_component(name);
  if (leaf.starts_with("hc_") && (ends_with(leaf, "_base") || ends_with(leaf, "_scale"))) return ParamGroup::AdamW;
  if (leaf == "attn_sink" || leaf == "ape") return ParamGroup::AdamW;
  if (shape.size() >= 2) return ParamGroup::Muon;
  return ParamGroup::AdamW;
}

bool glob_match(std::string_view p, std::string_view t) {
  // Iterative matcher with single-star backtracking: linear in practice.
  size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++pi, ++ti;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++, mark = ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1, ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

void apply_freeze(std::vector<ParamRef>& params, const std::vector<std::string>& patterns) {
  for (const auto& pat : patterns) {
    int hits = 0;
    for (auto& p : params) {
      if (!glob_match(pat, p.name)) continue;
      ++hits;
      if (p.trains()) p.group = ParamGroup::Frozen;
    }
    TREX_CHECK(hits > 0, "freeze pattern '{}' matches no parameter", pat);
  }
}

}  // namespace trex::optim
