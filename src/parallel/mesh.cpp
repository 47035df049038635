#include "parallel/mesh.h"

#include <fmt/format.h>

#include <cctype>
#include <sstream>

#include "core/error.h"

namespace trex::parallel {

std::string check_mesh(const MeshSpec& s, int world_size, const ModelShape& m) {
  if (s.pp < 1 || s.dp < 1 || s.ep < 1 || s.vpp < 1 || s.tp < 1 || s.etp < 1)
    return "every parallel degree must be >= 1";
  if (s.pp * s.dp * s.tp != world_size) {
    if (s.tp == 1)
      return fmt::format("pp={} x dp={} = {} ranks, but {} processes were launched", s.pp, s.dp, s.pp * s.dp,
                         world_size);
    return fmt::format("pp={} x dp={} x tp={} = {} ranks, but {} processes were launched", s.pp, s.dp, s.tp,
                       s.pp * s.dp * s.tp, world_size);
  }
  if (s.tp > 1 && m.n_heads > 0 && m.n_heads % s.tp != 0)
    return fmt::format("tp={} does not divide the {} attention query heads", s.tp, m.n_heads);
  if (s.tp > 1 && m.o_groups > 0 && m.o_groups % s.tp != 0)
    return fmt::format("tp={} does not divide the attention's {} output-projection groups (o_groups)", s.tp,
                       m.o_groups);
  if (s.tp > 1 && m.shared_inter > 0 && m.shared_inter % s.tp != 0)
    return fmt::format("tp={} does not divide the shared expert's hidden width {}", s.tp, m.shared_inter);
  if (s.etp != 1 && s.etp != s.tp)
    return fmt::format("etp={} must be 1 (routed experts whole on every TP rank) or tp={} (split over the TP group)",
                       s.etp, s.tp);
  // The grouped expert GEMMs take widths in multiples of 8 elements.
  if (s.etp > 1 && m.expert_inter > 0 && m.expert_inter % (8 * s.etp) != 0)
    return fmt::format("etp={} does not split the routed experts' hidden width {} into multiples of 8", s.etp,
                       m.expert_inter);
  if (s.dp % s.ep != 0) return fmt::format("ep={} does not divide dp={} (EP is folded into DP)", s.ep, s.dp);
  if (m.n_experts % s.ep != 0)
    return fmt::format("ep={} does not divide the {} routed experts", s.ep, m.n_experts);
  int stages = s.pp * s.vpp;
  if (stages > 1 && m.n_layers < stages)
    return fmt::format("{} pipeline stages (pp={} x vpp={}) for only {} layers", stages, s.pp, s.vpp, m.n_layers);
  if (s.vpp > 1 && s.pp == 1) return "an interleaved schedule (vpp > 1) needs pp > 1";
  return "";
}

MeshSpec parse_mesh_spec(const std::string& text) {
  MeshSpec s;
  std::string t;
  for (char c : text) t += (c == ',' || c == ' ' || c == ';') ? ' ' : char(std::tolower(c));
  std::istringstream in(t);
  std::string tok;
  while (in >> tok) {
    size_t i = 0;
    while (i < tok.size() && std::isalpha(static_cast<unsigned char>(tok[i]))) ++i;
    std::string key = tok.substr(0, i);
    std::string val = tok.substr(i);
    if (!val.empty() && val[0] == '=') val = val.substr(1);
    int v = 0;
    try {
      size_t used = 0;
      v = std::stoi(val, &used);
      TREX_CHECK(used == val.size(), "");
    } catch (...) {
      fail("parallel layout '{}': '{}' is not of the form pp=2 / PP2", text, tok);
    }
    if (key == "pp") s.pp = v;
    else if (key == "dp") s.dp = v;
    else if (key == "ep") s.ep = v;
    else if (key == "vpp") s.vpp = v;
    else if (key == "tp") s.tp = v;
    else if (key == "etp") s.etp = v;
    else fail("parallel layout '{}': unknown dimension '{}' (expected pp, dp, ep, vpp, tp, etp)", text, key);
  }
  return s;
}

Mesh build_mesh(comm::Communicator& world, const MeshSpec& spec, const ModelShape& model) {
  std::string why = check_mesh(spec, world.size(), model);
  TREX_CHECK(why.empty(), "impossible parallel layout: {}", why);
  Mesh m;
  m.spec = spec;
  m.world_rank = world.rank();
  m.world_size = world.size();
  const int T = spec.tp, replica = m.world_rank / T;  // replica: the rank's place in the TP-free pp x dp mesh
  m.tp_rank = m.world_rank % T;
  m.pp_rank = replica / spec.dp;
  m.dp_rank = replica % spec.dp;
  m.ep_rank = m.dp_rank % spec.ep;
  m.edp_rank = m.dp_rank / spec.ep;
  // Colours: the groups of one TP rank are those of the TP-free mesh (tp = 1 gives the same colours as before).
  m.dp_group = world.split(m.pp_rank * T + m.tp_rank, m.dp_rank);
  m.ep_group = world.split((m.pp_rank * spec.dp + m.edp_rank) * T + m.tp_rank, m.ep_rank);
  m.edp_group = world.split((m.pp_rank * spec.dp + m.ep_rank) * T + m.tp_rank, m.edp_rank);
  m.pp_group = world.split(m.dp_rank * T + m.tp_rank, m.pp_rank);
  m.tp_group = world.split(replica, m.tp_rank);
  TREX_ASSERT(m.ep_group->size() == spec.ep && m.dp_group->size() == spec.dp && m.pp_group->size() == spec.pp &&
              m.tp_group->size() == T);
  return m;
}

}  // namespace trex::parallel
