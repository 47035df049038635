// The device mesh: pipeline (PP) x data (DP) ranks, with expert parallelism (EP) folded into the data-
// parallel ranks of each stage (Megatron's "parallel folding"): the dense parts are replicated over DP,
// the routed experts are sharded over EP groups of `ep` consecutive DP ranks, and the ranks holding the
// same expert shard form an expert-data-parallel (EDP) group that reduces its gradients.
//
// Tensor parallelism (TP, Megatron-style, inside a stage): tp consecutive ranks split the attention's query heads
// (and the grouped output projection's groups) and the shared expert's hidden columns; everything else is
// replicated over them. TP is innermost, as Megatron orders it, so a TP group stays inside a node.
//
// Rank order: world rank = (pp_rank * dp + dp_rank) * tp + tp_rank (stages outermost, TP innermost), so an EP
// group (the ep consecutive DP ranks of one TP rank) is contiguous per TP rank and stays inside a node when
// ep * tp <= GPUs per node. The DP / EP / EDP / PP groups are formed among the ranks of one TP rank.
#pragma once
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace trex::parallel {

struct MeshSpec {
  int pp = 1;
  int dp = 1;  // data-parallel ranks per stage (EP is folded into these)
  int ep = 1;  // expert-parallel group size; divides dp
  int vpp = 1; // virtual stages per rank (interleaved schedule)
  int tp = 1;  // tensor-parallel ranks per stage replica (innermost); world = pp * dp * tp
  // Expert tensor parallelism: 1 (routed experts whole on every TP rank) or tp (each expert split over the TP
  // group like the shared expert). No rank is added: the experts stay expert-parallel over the DP ranks.
  int etp = 1;
};

struct ModelShape {  // what the mesh must divide
  int n_layers = 1;
  int n_experts = 1;
  // What tensor parallelism splits (0 = not given: not checked): the attention's query heads and its output
  // groups, the shared expert's hidden width. TP must divide each.
  int n_heads = 0, o_groups = 0, shared_inter = 0;
  int expert_inter = 0;  // a routed expert's hidden width, which etp splits (0 = not given)
};

// Empty when the layout is possible, else the reason (e.g. "ep=3 does not divide dp=4").
std::string check_mesh(const MeshSpec& spec, int world_size, const ModelShape& model);
MeshSpec parse_mesh_spec(const std::string& text);  // "pp=2,dp=4,ep=4,tp=2,etp=2" or "PP2 DP4 EP4 TP2 ETP2"

struct Mesh {
  MeshSpec spec;
  int world_rank = 0, world_size = 1;
  int pp_rank = 0, dp_rank = 0, ep_rank = 0, edp_rank = 0, tp_rank = 0;
  std::unique_ptr<comm::Communicator> dp_group;   // same stage, all DP ranks (dense gradients, ZeRO-1)
  std::unique_ptr<comm::Communicator> ep_group;   // same stage, the ep ranks sharing tokens
  std::unique_ptr<comm::Communicator> edp_group;  // same stage, same expert shard (expert gradients)
  std::unique_ptr<comm::Communicator> pp_group;   // same dp_rank, all stages (activations point to point)
  std::unique_ptr<comm::Communicator> tp_group;   // same stage and dp_rank: the tp consecutive ranks

  int first_local_expert(int n_experts) const { return ep_rank * (n_experts / spec.ep); }
  int n_local_experts(int n_experts) const { return n_experts / spec.ep; }
};

// Splits `world` into the groups; throws trex::Error with check_mesh's reason for impossible layouts.
Mesh build_mesh(comm::Communicator& world, const MeshSpec& spec, const ModelShape& model);

}  // namespace trex::parallel
