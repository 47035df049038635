// trex ckpt inspect PATH           tensors (dtype, shape, bytes) and the config summary of a checkpoint
// trex ckpt convert --in --out     re-export a DeepSeek-V4 checkpoint in the other naming / dtype
// trex ckpt consolidate DIR --out ROOT   a (sharded) training checkpoint as one process's state checkpoint
#include <chrono>
#include <cstdio>
#include <map>

#include "ckpt/safetensors.h"
#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "model/dsv4/checkpoint.h"
#include "model/dsv4/config.h"
#include "model/dsv4/naming.h"
#include "train/sharded_checkpoint.h"

namespace trex::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

const char* attn_label(dsv4::AttnType t) {
  return t == dsv4::AttnType::Sliding ? "SWA" : t == dsv4::AttnType::CSA ? "CSA" : "HCA";
}

void print_config_summary(const fs::path& config_path) {
  dsv4::ModelConfig c = dsv4::load_model_config(config_path);
  int64_t params = 0;
  for (const auto& e : dsv4::expected_tensors(c))
    if (e.dtype != DType::I64) params += numel(e.shape);  // tid2eid is a routing table, not a parameter
  std::map<std::string, int> kinds;
  std::string schedule;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    std::string k = attn_label(c.attn_types[size_t(l)]);
    if (c.attn_types[size_t(l)] != dsv4::AttnType::Sliding)
      k += "/" + std::to_string(c.compress_ratio[size_t(l)]);
    kinds[k]++;
    schedule += (l ? " " : "") + k + (c.mlp_types[size_t(l)] == dsv4::MlpType::HashMoE ? "+hash" : "");
  }
  std::printf("config %s (%s dialect)\n", config_path.string().c_str(), c.source_dialect.c_str());
  std::printf(
      "  d=%ld layers=%ld (+%ld MTP) heads=%ld x %ld (rope %ld) q_lora=%ld o=%ldx%ld window=%ld vocab=%ld\n",
      long(c.hidden), long(c.n_layers), long(c.n_mtp), long(c.n_heads), long(c.head_dim), long(c.rope_dim),
      long(c.q_lora_rank), long(c.o_groups), long(c.o_lora_rank), long(c.window), long(c.vocab_size));
  std::printf("  experts %ld routed (top-%ld) + %ld shared, width %ld; hash layers %ld; mHC %ld streams\n",
              long(c.n_routed_experts), long(c.topk), long(c.n_shared_experts), long(c.moe_inter),
              long(c.n_hash_layers()), long(c.hc_mult));
  std::printf("  rope main theta %g%s; compress theta %g%s\n", c.rope_main.theta,
              c.rope_main.yarn ? " yarn" : "", c.rope_compress.theta,
              c.rope_compress.yarn ? fmt::format(" yarn x{} from {}", c.rope_compress.factor,
                                                 c.rope_compress.original_max_position)
                                         .c_str()
                                   : "");
  std::string counts;
  for (const auto& [k, n] : kinds) counts += fmt::format(" {}:{}", k, n);
  std::printf("  layers:%s\n  schedule: %s\n", counts.c_str(), schedule.c_str());
  std::printf("  parameters implied by the config: %ld (%.3f M)\n", long(params), double(params) / 1e6);
}

void inspect(const std::string& path, bool all) {
  ckpt::SafetensorsReader r(path);
  std::vector<std::string> names = r.names();
  std::map<std::string, std::pair<size_t, size_t>> by_dtype;  // dtype -> (count, bytes)
  for (const auto& n : names) {
    const auto& e = r.entry(n);
    auto& d = by_dtype[std::string(dtype_name(e.dtype))];
    d.first++;
    d.second += e.nbytes();
  }
  std::printf("%s: %zu file(s), %zu tensors, %s of tensor data, %s naming\n", path.c_str(), r.files().size(),
              names.size(), human_bytes(double(r.total_bytes())).c_str(),
              dsv4::naming_name(dsv4::detect_naming(names)));
  for (const auto& [dt, cb] : by_dtype)
    std::printf("  %-8s %7zu tensors %12s\n", dt.c_str(), cb.first, human_bytes(double(cb.second)).c_str());
  const size_t limit = all ? names.size() : std::min<size_t>(names.size(), 200);
  size_t width = 0;
  for (size_t i = 0; i < limit; ++i) width = std::max(width, names[i].size());
  for (size_t i = 0; i < limit; ++i) {
    const auto& e = r.entry(names[i]);
    std::printf("%-*s  %-8s %-20s %12s%s%s\n", int(width), names[i].c_str(),
                std::string(dtype_name(e.dtype)).c_str(), shape_str(e.shape).c_str(),
                human_bytes(double(e.nbytes())).c_str(), r.sharded() ? "  " : "",
                r.sharded() ? r.file_of(names[i]).filename().c_str() : "");
  }
  if (limit < names.size()) std::printf("... %zu more (use --all)\n", names.size() - limit);
  fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  if (fs::exists(dir / "config.json")) print_config_summary(dir / "config.json");
}

const bool registered = register_command(
    {"ckpt", "Inspect and convert safetensors checkpoints", [](CLI::App& sub) {
       sub.require_subcommand(1);

       auto* ins =
           sub.add_subcommand("inspect", "List tensors (dtype, shape, bytes) and summarise config.json");
       auto path = std::make_shared<std::string>();
       auto all = std::make_shared<bool>(false);
       ins->add_option("path", *path, "checkpoint directory or .safetensors file")->required();
       ins->add_flag("--all", *all, "list every tensor (default: the first 200)");
       ins->callback([path, all] { inspect(*path, *all); });

       auto* conv =
           sub.add_subcommand("convert", "Re-export a DeepSeek-V4 checkpoint (naming, dtype, shards)");
       struct Opts {
         std::string in, out, naming = "transformers", dtype = "bf16";
         double shard_gb = 5.0;
         bool allow_unexpected = false;
       };
       auto o = std::make_shared<Opts>();
       conv->add_option("--in", o->in, "source checkpoint directory (config.json + safetensors)")->required();
       conv->add_option("--out", o->out, "output directory")->required();
       conv->add_option("--naming", o->naming, "official | transformers")
           ->check(CLI::IsMember({"official", "transformers"}))
           ->capture_default_str();
       conv->add_option("--dtype", o->dtype, "bf16 | f32 (mHC, ape, sinks, gate bias stay f32)")
           ->check(CLI::IsMember({"bf16", "f32"}))
           ->capture_default_str();
       conv->add_option("--shard-gb", o->shard_gb, "maximum shard size in GB")->capture_default_str();
       conv->add_flag("--allow-unexpected", o->allow_unexpected,
                      "skip tensors the config does not account for");
       conv->callback([o] {
         TREX_CHECK(o->shard_gb > 0, "--shard-gb must be positive, got {}", o->shard_gb);
         TREX_CHECK(fs::absolute(o->in) != fs::absolute(o->out), "--out must differ from --in ({})", o->in);
         auto t0 = std::chrono::steady_clock::now();
         dsv4::ModelConfig cfg = dsv4::load_model_config(fs::path(o->in) / "config.json");
         dsv4::LoadOptions lo;
         lo.allow_unexpected = o->allow_unexpected;
         dsv4::StateDict state = dsv4::load_state_dict(o->in, cfg, lo);
         dsv4::Dialect dialect =
             o->naming == "official" ? dsv4::Dialect::Official : dsv4::Dialect::Transformers;
         DType dtype = o->dtype == "f32" ? DType::F32 : DType::BF16;
         dsv4::save_state_dict(o->out, state, cfg, dialect, dtype, size_t(o->shard_gb * 1e9));
         double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
         ckpt::SafetensorsReader written(o->out);
         std::printf("converted %s -> %s: %zu tensors in %zu file(s), %s, %s naming, %s, %.1fs\n",
                     o->in.c_str(), o->out.c_str(), written.size(), written.files().size(),
                     human_bytes(double(written.total_bytes())).c_str(), o->naming.c_str(), o->dtype.c_str(),
                     secs);
       });

       auto* cons = sub.add_subcommand(
           "consolidate", "Write a training checkpoint (sharded, any layout) as a one-process checkpoint");
       auto cin = std::make_shared<std::string>(), cout = std::make_shared<std::string>();
       cons->add_option("dir", *cin, "a checkpoint step directory (manifest.json or state.json)")->required();
       cons->add_option("--out", *cout, "directory to write step_NNNNNNNN into (e.g. RUN/checkpoints)")->required();
       cons->callback([cin, cout] {
         const fs::path written = train::consolidate_checkpoint(*cin, *cout);
         std::printf("{\"checkpoint\": \"%s\", \"out\": \"%s\"}\n", cin->c_str(), written.string().c_str());
       });
     }});

}  // namespace
}  // namespace trex::cli
