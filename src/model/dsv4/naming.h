// Tensor names: the OFFICIAL checkpoint keys (design §3, e.g. `layers.3.attn.wq_a.weight`) are the
// project's canonical names; transformers names (design §3.6, e.g.
// `model.layers.3.self_attn.q_a_proj.weight`) are mapped to and from them here.
//
// Every key maps 1:1 except the routed experts: official `layers.N.ffn.experts.{e}.w1|w3|w2.weight` are
// stacked by transformers into `model.layers.N.mlp.experts.gate_up_proj` [E, 2f, d] (w1 rows, then w3
// rows) and `model.layers.N.mlp.experts.down_proj` [E, d, f]; the (un)stacking of the data is done by
// checkpoint.h. MTP keys (`mtp.0.*`) exist only in official naming: transformers does not model MTP, so
// they keep their official names inside transformers-named files (transformers ignores them on load).
// FP8 scales: official `X.scale` <-> transformers `X'.weight_scale_inv`.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace trex::dsv4 {

enum class Naming { Official, Transformers };

// Throws trex::Error naming the key when it is not a DeepSeek-V4 key of the source naming, and for the
// routed-expert keys that have no 1:1 counterpart (see routed_expert_* below).
std::string official_to_transformers(std::string_view official);
// Accepts the spellings seen in the wild: `q_a_norm` and `q_norm`; the indexer's `weights_proj` with
// or without the `scorer.` level; per-expert `mlp.experts.{e}.gate_proj|up_proj|down_proj.weight`.
std::string transformers_to_official(std::string_view transformers);

// Official routed-expert keys: `layers.N.ffn.experts.E.w{1,2,3}.{weight,scale}` (also under `mtp.0.`).
struct ExpertKey {
  std::string block;  // "layers.N" or "mtp.0"
  int64_t expert = 0;
  int w = 1;  // 1 gate, 3 up, 2 down
  bool scale = false;
};
bool parse_official_expert_key(std::string_view name, ExpertKey* out);
std::string official_expert_key(const std::string& block, int64_t expert, int w, bool scale = false);

// transformers stacked-expert keys of main layer N: gate_up_proj [E, 2f, d] and down_proj [E, d, f].
std::string transformers_gate_up_key(int64_t layer);
std::string transformers_down_key(int64_t layer);
// True for `model.layers.N.mlp.experts.gate_up_proj` / `down_proj`; sets *layer and *gate_up.
bool parse_transformers_stacked_key(std::string_view name, int64_t* layer, bool* gate_up);

// Which naming a set of keys uses: transformers if any key starts with "model." or is "lm_head.weight".
Naming detect_naming(const std::vector<std::string>& names);
const char* naming_name(Naming n);  // "official" / "transformers"

}  // namespace trex::dsv4
