// Sharded checkpoints in one process (world of one over the local communicator): the files and manifest a save
// writes, loading back into ZeRO-1 and into the ordinary optimiser (every tensor bit-equal), consolidation into
// a one-process checkpoint, a fault injected at each stage of a save leaving the previous checkpoint the newest
// loadable one, and the errors for a missing tensor, a wrong shape and a corrupt file. The layouts of several
// processes are tested end to end under mpirun in test_sharded_checkpoint_cli.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "core/files.h"
#include "parallel/mesh.h"
#include "parallel/zero1_optimizer.h"
#include "train/sharded_checkpoint.h"
#include "train/state_checkpoint.h"

namespace fs = std::filesystem;
using namespace trex;
using trex::train::TrainState;

namespace {

// A small "model": a dense matrix (Muon), a norm (AdamW), a routed expert (AdamW), a frozen tensor and a buffer.
struct Toy {
  std::vector<std::vector<float>> values, grads;
  std::vector<optim::ParamRef> params;
  explicit Toy(float base) {
    struct Spec {
      const char* name;
      Shape shape;
      optim::ParamGroup group;
    };
    const std::vector<Spec> specs = {{"layers.0.attn.wq.weight", {6, 4}, optim::ParamGroup::Muon},
                                     {"layers.0.attn_norm.weight", {4}, optim::ParamGroup::AdamW},
                                     {"layers.0.ffn.experts.1.w1.weight", {3, 4}, optim::ParamGroup::AdamW},
                                     {"embed.weight", {5, 4}, optim::ParamGroup::Frozen},
                                     {"layers.0.ffn.gate.bias", {4}, optim::ParamGroup::Buffer}};
    values.resize(specs.size());
    grads.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      const int64_t n = numel(specs[i].shape);
      values[i].resize(size_t(n));
      grads[i].resize(size_t(n));
      for (int64_t k = 0; k < n; ++k) {
        values[i][size_t(k)] = base + 0.01f * float(i * 31 + k);
        grads[i][size_t(k)] = 0.1f * float((k * 7 + i) % 5) - 0.2f;
      }
      const bool trains = specs[i].group == optim::ParamGroup::Muon || specs[i].group == optim::ParamGroup::AdamW;
      params.push_back({specs[i].name, specs[i].shape, values[i].data(), trains ? grads[i].data() : nullptr,
                        specs[i].group});
    }
  }
};

optim::OptimizerConfig opt_config() {
  optim::OptimizerConfig c;
  c.kind = "muon";
  c.clip_grad_norm = 0;
  return c;
}

// One process's mesh, model and ZeRO-1 optimiser.
struct Rank {
  std::unique_ptr<comm::Communicator> world = comm::make_local_communicator();
  parallel::Mesh mesh = parallel::build_mesh(*world, {1, 1, 1, 1}, {1, 4});
  Toy toy;
  parallel::Zero1Optimizer zero;
  explicit Rank(float base) : toy(base), zero(toy.params, opt_config(), mesh) {}
  void train_step() {
    zero.begin_grad_sync(1.0);
    zero.finish_grad_sync();
    zero.step(0.01);
  }
};

TrainState state_at(int64_t step) {
  TrainState st;
  st.step = step;
  st.rng = 1234 + uint64_t(step);
  st.tokens_seen = 100 * step;
  st.recent_losses = {3.0, 2.5};
  return st;
}

struct TempDir {
  fs::path p = fs::temp_directory_path() / ("trex_sharded_ckpt_" + std::to_string(::getpid()));
  TempDir() { fs::remove_all(p); }
  ~TempDir() { fs::remove_all(p); }
};

void expect_equal_model(Rank& a, Rank& b) {
  ASSERT_EQ(a.toy.params.size(), b.toy.params.size());
  for (size_t i = 0; i < a.toy.params.size(); ++i)
    EXPECT_EQ(0, std::memcmp(a.toy.params[i].value, b.toy.params[i].value, size_t(a.toy.params[i].numel()) * 4))
        << a.toy.params[i].name;
  auto sa = a.zero.state_tensors(), sb = b.zero.state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].name, sb[i].name);
    EXPECT_EQ(0, std::memcmp(sa[i].data, sb[i].data, size_t(numel(sa[i].shape)) * 4)) << sa[i].name;
  }
  EXPECT_EQ(a.zero.steps_done(), b.zero.steps_done());
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(ShardedCheckpoint, SaveWritesEveryTensorOnceAndLoadsBackExactly) {
  TempDir d;
  Rank a(1.0f);
  a.train_step();
  a.train_step();
  train::ShardedSaveArgs args;
  args.config = {{"seed", 7}};
  const fs::path dir = train::save_sharded_checkpoint(d.p, state_at(2), a.toy.params, a.zero, a.mesh, *a.world, args);
  EXPECT_EQ(dir, d.p / "step_00000002");
  for (const char* f : {"manifest.json", "rank-0.safetensors", "rank-0.optim.safetensors", "rank-0.json"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  const json m = read_json_file(dir / "manifest.json");
  EXPECT_EQ(m["step"], 2);
  EXPECT_EQ(m["optimizer_steps"], 2);
  EXPECT_EQ(m["layout"]["world"], 1);
  EXPECT_EQ(m["config"]["seed"], 7);
  EXPECT_EQ(m["tensors"]["params"].size(), 5u);  // frozen and buffer tensors too
  // Muon matrix: momentum; AdamW tensors: two moments each.
  EXPECT_EQ(m["tensors"]["optim"].size(), 5u);
  EXPECT_TRUE(m["tensors"]["optim"].contains("layers.0.attn.wq.weight.momentum"));
  EXPECT_TRUE(m["tensors"]["optim"].contains("layers.0.ffn.experts.1.w1.weight.exp_avg_sq"));
  EXPECT_EQ(train::latest_checkpoint(d.p).value_or(fs::path()), dir);

  Rank b(-5.0f);  // different values everywhere before the load
  const TrainState st = train::load_into_zero1(dir, b.toy.params, b.zero);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(st.rng, state_at(2).rng);
  EXPECT_EQ(st.recent_losses, state_at(2).recent_losses);
  expect_equal_model(a, b);
  // Training on from the loaded state stays identical.
  a.train_step();
  b.train_step();
  expect_equal_model(a, b);

  // Into one process's ordinary optimiser (load_checkpoint dispatches on manifest.json).
  Toy c(9.0f);
  optim::Optimizer plain(c.params, opt_config());
  train::load_checkpoint(dir, c.params, plain);
  EXPECT_EQ(plain.steps_done(), 2);
  Rank again(1.0f);
  again.train_step();
  again.train_step();
  for (size_t i = 0; i < c.params.size(); ++i)
    EXPECT_EQ(0, std::memcmp(c.params[i].value, again.toy.params[i].value, size_t(c.params[i].numel()) * 4))
        << c.params[i].name;
  auto ps = plain.state_tensors(), zs = again.zero.state_tensors();  // (orders differ: compare by name)
  ASSERT_EQ(ps.size(), zs.size());
  for (const auto& x : ps) {
    auto it = std::find_if(zs.begin(), zs.end(), [&](const optim::StateTensor& z) { return z.name == x.name; });
    ASSERT_NE(it, zs.end()) << x.name;
    EXPECT_EQ(0, std::memcmp(x.data, it->data, size_t(numel(x.shape)) * 4)) << x.name;
  }
}

TEST(ShardedCheckpoint, ConsolidatesIntoAOneProcessCheckpoint) {
  TempDir d;
  Rank a(2.0f);
  a.train_step();
  const fs::path dir =
      train::save_sharded_checkpoint(d.p / "sharded", state_at(1), a.toy.params, a.zero, a.mesh, *a.world, {});
  const fs::path one = train::consolidate_checkpoint(dir, d.p / "one");
  EXPECT_EQ(one, d.p / "one" / "step_00000001");
  EXPECT_TRUE(fs::exists(one / "state.json"));
  EXPECT_FALSE(fs::exists(one / "manifest.json"));
  Rank b(0.0f);
  const TrainState st = train::load_into_zero1(one, b.toy.params, b.zero);  // the one-process format, by name
  EXPECT_EQ(st.tokens_seen, 100);
  expect_equal_model(a, b);
}

TEST(ShardedCheckpoint, AFaultAtAnyStageLeavesThePreviousCheckpointNewest) {
  for (const char* stage : {"params", "optimizer", "rank_index", "manifest", "rename"}) {
    TempDir d;
    Rank a(1.0f);
    a.train_step();
    const fs::path good =
        train::save_sharded_checkpoint(d.p, state_at(1), a.toy.params, a.zero, a.mesh, *a.world, {});
    Rank snapshot(1.0f);
    snapshot.train_step();
    a.train_step();
    train::ShardedSaveArgs args;
    args.fault = [stage](std::string_view s) {
      if (s == stage) throw Error(std::string("injected crash at ") + stage);
    };
    const std::string err = error_of(
        [&] { train::save_sharded_checkpoint(d.p, state_at(2), a.toy.params, a.zero, a.mesh, *a.world, args); });
    EXPECT_NE(err.find("injected crash"), std::string::npos) << stage << ": " << err;
    EXPECT_FALSE(fs::exists(d.p / "step_00000002")) << stage;
    ASSERT_EQ(train::latest_checkpoint(d.p).value_or(fs::path()), good) << stage;
    Rank b(7.0f);
    EXPECT_EQ(train::load_into_zero1(good, b.toy.params, b.zero).step, 1) << stage;
    expect_equal_model(snapshot, b);
    // The next save succeeds and clears the interrupted one's temporary directory.
    train::save_sharded_checkpoint(d.p, state_at(2), a.toy.params, a.zero, a.mesh, *a.world, {});
    EXPECT_EQ(train::latest_checkpoint(d.p).value_or(fs::path()), d.p / "step_00000002") << stage;
    for (const auto& e : fs::directory_iterator(d.p))
      EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();
  }
}

TEST(ShardedCheckpoint, KeepsTheNewestKeepLast) {
  TempDir d;
  Rank a(1.0f);
  train::ShardedSaveArgs args;
  args.keep_last = 2;
  for (int64_t s = 1; s <= 4; ++s)
    train::save_sharded_checkpoint(d.p, state_at(s), a.toy.params, a.zero, a.mesh, *a.world, args);
  auto all = train::list_checkpoints(d.p);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, 3);
  EXPECT_EQ(all[1].first, 4);
}

TEST(ShardedCheckpoint, ErrorsNameTheTensorAndTheFile) {
  TempDir d;
  Rank a(1.0f);
  a.train_step();
  const fs::path dir = train::save_sharded_checkpoint(d.p, state_at(1), a.toy.params, a.zero, a.mesh, *a.world, {});

  // A tensor the checkpoint does not have.
  Rank b(0.0f);
  std::vector<float> extra(3);
  std::vector<optim::ParamRef> more = b.toy.params;
  more.push_back({"layers.9.attn.wq.weight", {3}, extra.data(), nullptr, optim::ParamGroup::Buffer});
  std::string err = error_of([&] { train::CheckpointReader(dir).read_param(more.back().name, {3}, extra.data()); });
  EXPECT_NE(err.find("layers.9.attn.wq.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("lacks"), std::string::npos) << err;

  // A shape the checkpoint disagrees with.
  std::vector<float> wrong(25);
  err = error_of([&] { train::CheckpointReader(dir).read_param("embed.weight", {5, 5}, wrong.data()); });
  EXPECT_NE(err.find("embed.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("rank-0.safetensors"), std::string::npos) << err;

  // A flipped byte in a tensor's data: the checksum names tensor and file.
  {
    const fs::path f = dir / "rank-0.safetensors";
    std::string bytes = read_text_file(f);
    bytes[bytes.size() - 2] ^= 0x40;  // inside the last tensor written
    std::ofstream(f, std::ios::binary | std::ios::trunc) << bytes;
  }
  err = error_of([&] { train::load_into_zero1(dir, b.toy.params, b.zero); });
  EXPECT_NE(err.find("checksum"), std::string::npos) << err;
  EXPECT_NE(err.find("rank-0.safetensors"), std::string::npos) << err;

  // A rank file that is gone.
  fs::remove(dir / "rank-0.optim.safetensors");
  err = error_of([&] {
    train::CheckpointReader r(dir);
    std::vector<float> m(24);
    r.read_optim("layers.0.attn.wq.weight.momentum", {6, 4}, m.data());
  });
  EXPECT_NE(err.find("layers.0.attn.wq.weight.momentum"), std::string::npos) << err;
  EXPECT_NE(err.find("rank-0.optim.safetensors"), std::string::npos) << err;
}

// ---- two processes (dp=2, ep=2) under mpirun: the driver below starts this binary's worker test ----

namespace {

// One world communicator per process (MPI is initialised once), shared by the MpiRanks below.
comm::Communicator& mpi_world() {
  static std::unique_ptr<comm::Communicator> w = comm::make_world_communicator("auto");
  return *w;
}

// Rank r of dp=2,ep=2: dense tensors replicated (the same values on both), experts 2r and 2r+1 local.
struct MpiRank {
  comm::Communicator& world = mpi_world();
  parallel::Mesh mesh = parallel::build_mesh(world, {1, 2, 2, 1}, {1, 4});
  std::vector<std::vector<float>> values, grads;
  std::vector<optim::ParamRef> params;
  std::unique_ptr<parallel::Zero1Optimizer> zero;
  explicit MpiRank(float base) {
    std::vector<std::pair<std::string, Shape>> specs = {{"layers.0.attn.wq.weight", {6, 4}},
                                                        {"layers.0.attn.wkv.weight", {4, 4}},
                                                        {"layers.0.attn_norm.weight", {4}}};
    for (int e = 2 * mesh.ep_rank; e < 2 * mesh.ep_rank + 2; ++e)
      specs.push_back({"layers.0.ffn.experts." + std::to_string(e) + ".w1.weight", {3, 4}});
    values.resize(specs.size());
    grads.resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      const int64_t n = numel(specs[i].second);
      const size_t salt = std::hash<std::string>{}(specs[i].first) % 97;  // by name: equal on every rank
      for (int64_t k = 0; k < n; ++k) {
        values[i].push_back(base + 0.01f * float(salt + size_t(k)));
        grads[i].push_back(0.05f * float((k * 3 + int64_t(salt)) % 7) - 0.15f);
      }
      params.push_back({specs[i].first, specs[i].second, values[i].data(), grads[i].data(),
                        specs[i].second.size() == 2 ? optim::ParamGroup::Muon : optim::ParamGroup::AdamW});
    }
    zero = std::make_unique<parallel::Zero1Optimizer>(params, opt_config(), mesh);
  }
  void train_step() {
    zero->begin_grad_sync(1.0);
    zero->finish_grad_sync();
    zero->step(0.01);
  }
};

}  // namespace

TEST(ShardedCheckpointMpiWorker, TwoRanks) {
  const char* root_env = std::getenv("TREX_SHARDED_CKPT_WORKER");
  if (!root_env) GTEST_SKIP() << "run by ShardedCheckpointMpi.CrashMidSaveAndReshard under mpirun";
  const fs::path root = root_env;
  MpiRank a(1.0f);
  ASSERT_EQ(a.world.size(), 2);
  const int R = a.world.rank();
  a.train_step();
  const fs::path good = train::save_sharded_checkpoint(root, state_at(1), a.params, *a.zero, a.mesh, a.world, {});
  MpiRank snapshot(1.0f);
  snapshot.train_step();

  // Rank 1 crashes while writing its optimiser state: both ranks fail, step 2 never appears.
  a.train_step();
  train::ShardedSaveArgs args;
  args.fault = [R](std::string_view s) {
    if (R == 1 && s == "optimizer") throw Error("injected crash on rank 1");
  };
  const std::string err =
      error_of([&] { train::save_sharded_checkpoint(root, state_at(2), a.params, *a.zero, a.mesh, a.world, args); });
  EXPECT_NE(err.find(R == 1 ? "injected crash" : "1 rank(s) failed"), std::string::npos) << "rank " << R << ": " << err;
  a.world.barrier();
  EXPECT_FALSE(fs::exists(root / "step_00000002"));
  ASSERT_EQ(train::latest_checkpoint(root).value_or(fs::path()), good);
  MpiRank b(-3.0f);
  EXPECT_EQ(train::load_into_zero1(good, b.params, *b.zero).step, 1);
  for (size_t i = 0; i < b.params.size(); ++i)
    EXPECT_EQ(0, std::memcmp(b.values[i].data(), snapshot.values[i].data(), b.values[i].size() * 4))
        << b.params[i].name;
  EXPECT_EQ(b.zero->steps_done(), 1);

  // The successful save of step 2: every tensor once, experts in the file of their EP rank.
  const fs::path dir = train::save_sharded_checkpoint(root, state_at(2), a.params, *a.zero, a.mesh, a.world, {});
  a.world.barrier();
  const json m = read_json_file(dir / "manifest.json");
  EXPECT_EQ(m["layout"]["dp"], 2);
  EXPECT_EQ(m["layout"]["ep"], 2);
  EXPECT_EQ(m["tensors"]["params"].size(), 3u + 4u);
  for (int e = 0; e < 4; ++e)
    EXPECT_EQ(m["tensors"]["params"]["layers.0.ffn.experts." + std::to_string(e) + ".w1.weight"]["file"],
              e < 2 ? "rank-0.safetensors" : "rank-1.safetensors");
  std::set<std::string> dense_files;
  for (const char* n : {"layers.0.attn.wq.weight", "layers.0.attn.wkv.weight", "layers.0.attn_norm.weight"})
    dense_files.insert(m["tensors"]["params"][n]["file"].get<std::string>());
  EXPECT_EQ(dense_files.size(), 2u) << "ZeRO-1 owners on both ranks write dense tensors";
  // Another layout (one process) finds every tensor: this rank's values and states by name.
  train::CheckpointReader r(dir);
  for (size_t i = 0; i < a.params.size(); ++i) {
    std::vector<float> v(a.values[i].size());
    r.read_param(a.params[i].name, a.params[i].shape, v.data());
    EXPECT_EQ(v, a.values[i]) << a.params[i].name;
  }
  EXPECT_EQ(r.optim_names().size(), 2u + 2u + 4u);  // dense momenta, the norm's two moments, four experts' momenta
}

TEST(ShardedCheckpointMpi, CrashMidSaveAndReshard) {
  std::string out;
  ASSERT_EQ(std::system("command -v mpirun > /dev/null 2>&1"), 0)
      << "mpirun not found (scripts/setup.sh installs openmpi-bin)";
  TempDir d;
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  const std::string cmd =
      "env OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 mpirun --allow-run-as-root "
      "--oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -x TREX_SHARDED_CKPT_WORKER=" + d.p.string() +
      " -np 2 " + exe + " --gtest_color=no --gtest_filter=ShardedCheckpointMpiWorker.TwoRanks 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p && (n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = p ? ::pclose(p) : -1;
  EXPECT_EQ(WEXITSTATUS(rc), 0) << cmd << "\n" << out;
  EXPECT_NE(out.find("[  PASSED  ] 1 test"), std::string::npos) << out;
  EXPECT_EQ(out.find("SKIPPED"), std::string::npos) << out;
}
