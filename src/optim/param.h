// The trainer's view of one parameter tensor: a name (the official checkpoint name), its shape, fp32
// master values and gradient in memory the model owns, and which optimiser updates it.
#pragma once
#include <string>
#include <string_view>

#include "core/tensor.h"

namespace trex::optim {

// muon: 2-D (or stacked 2-D, leading dims are independent matrices) weights updated by Muon.
// adamw: everything else that trains. frozen: trainable in principle, held fixed this run.
// buffer: state that is not a trained parameter (router bias, tid2eid); saved, never given to an optimiser.
enum class ParamGroup { Muon, AdamW, Frozen, Buffer };

std::string_view group_name(ParamGroup g);
ParamGroup parse_group(std::string_view s);  // "muon" | "adamw" | "frozen" | "buffer"

struct ParamRef {
  std::string name;
  Shape shape;
  float* value = nullptr;
  float* grad = nullptr;  // null for buffers (and allowed null for frozen)
  ParamGroup group = ParamGroup::AdamW;
  int64_t numel() const { return trex::numel(shape); }
  bool trains() const { return group == ParamGroup::Muon || group == ParamGroup::AdamW; }
};

}  // namespace trex::optim
