// trex parity: runs the CPU DeepSeek-V4 model forward and backward on a golden fixture (made by
// make_fixture.py with Hugging Face transformers) and compares logits, loss, every hidden state, the CSA
// indexer selections and every gradient. Prints one JSON object; exits 1 when a tolerance is exceeded
// (fixture README: logits/hidden max|d|/max|ref| < 1e-4, loss |d| < 1e-5, each grad ||d||/||ref|| < 1e-3).
// --device cuda (CUDA builds): the GPU model's step (src/model/cuda, bf16 weights and activations) against the
// CPU fp32 model loaded with the same bf16-rounded weights (tight) and against the fixture (loose). The
// comparisons and their tolerances live in the library (model/dsv4/parity.h); this command parses and prints.
#include <omp.h>

#include <cstdio>

#include "command.h"
#include "core/error.h"
#include "model/dsv4/parity.h"

extern "C" void openblas_set_num_threads(int);

namespace trex::cli {
namespace {

struct ParityArgs {
  std::string model_dir, io_file, grads_file, device = "cpu";
  int threads = 0;
};

void run_parity(const ParityArgs& args) {
  TREX_CHECK(args.device == "cpu" || args.device == "cuda", "parity: unknown device '{}' (cpu or cuda)", args.device);
  if (args.threads > 0) {
    omp_set_num_threads(args.threads);
    openblas_set_num_threads(args.threads);
  }
  dsv4::ParityOptions o;
  o.model_dir = args.model_dir, o.io_file = args.io_file, o.grads_file = args.grads_file;
  const nlohmann::json out = args.device == "cuda" ? dsv4::parity_cuda(o) : dsv4::parity_cpu(o);
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  if (!out.at("pass").get<bool>()) exit_with(1);
}

const bool registered = register_command(
    {"parity", "compare the model's forward/backward (CPU, or GPU with --device cuda) with a golden fixture",
     [](CLI::App& sub) {
       auto a = std::make_shared<ParityArgs>();
       sub.add_option("--model", a->model_dir, "model directory: config.json + safetensors")->required();
       sub.add_option("--io", a->io_file, "fixture io.safetensors (input_ids, labels, logits, loss, ...)")
           ->required();
       sub.add_option("--grads", a->grads_file, "fixture grads.safetensors (transformers names)");
       sub.add_option("--device", a->device, "cpu, or cuda (the GPU training step vs the CPU and the fixture)")
           ->capture_default_str();
       sub.add_option("--threads", a->threads, "OpenMP/BLAS threads (0 = default)");
       sub.callback([a] { run_parity(*a); });
     }});

}  // namespace
}  // namespace trex::cli
