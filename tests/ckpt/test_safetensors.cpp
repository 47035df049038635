// safetensors reader/writer: round trips (single file, shards) and every malformed-input error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "ckpt/safetensors.h"
#include "ckpt_test_util.h"

using namespace trex;
using namespace trex::ckpt;
using trex::test::expect_error;
using trex::test::raw_safetensors;
using trex::test::ScratchDir;
using trex::test::write_bytes;

namespace {

struct Owned {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

// One tensor of every dtype, filled with seeded random bytes.
std::vector<Owned> every_dtype(uint32_t seed) {
  std::mt19937 rng(seed);
  const DType all[] = {DType::F64,     DType::F32,     DType::F16, DType::BF16, DType::F8_E4M3,
                       DType::F8_E8M0, DType::F4_E2M1, DType::I64, DType::I32,  DType::I16,
                       DType::I8,      DType::U8,      DType::BOOL};
  std::vector<Owned> out;
  int i = 0;
  for (DType t : all) {
    Owned o{std::string("t.") + std::string(dtype_name(t)), t, {3, 2 + i % 3 * 2}, {}};
    o.bytes.resize(dtype_bytes(t, size_t(numel(o.shape))));
    for (auto& b : o.bytes) b = uint8_t(rng());
    out.push_back(std::move(o));
    ++i;
  }
  out.push_back({"empty", DType::F32, {0, 5}, {}});
  out.push_back({"scalar", DType::F32, {}, {0, 0, 128, 63}});  // 1.0f
  return out;
}

std::vector<TensorToWrite> to_write(const std::vector<Owned>& ts) {
  std::vector<TensorToWrite> w;
  for (const auto& t : ts) w.push_back({t.name, t.dtype, t.shape, t.bytes.data(), {}});
  return w;
}

void expect_contents(const SafetensorsReader& r, const std::vector<Owned>& ts) {
  EXPECT_EQ(r.size(), ts.size());
  for (const auto& t : ts) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(r.contains(t.name));
    TensorView v = r.view(t.name);
    EXPECT_EQ(v.dtype, t.dtype);
    EXPECT_EQ(v.shape, t.shape);
    ASSERT_EQ(v.nbytes(), t.bytes.size());
    if (!t.bytes.empty()) {
      EXPECT_EQ(std::memcmp(v.data, t.bytes.data(), t.bytes.size()), 0);
    }
  }
}

}  // namespace

TEST(Safetensors, SingleFileRoundTripEveryDtype) {
  ScratchDir dir("single");
  auto ts = every_dtype(7);
  write_safetensors(dir / "a.safetensors", to_write(ts));
  SafetensorsReader r(dir / "a.safetensors");
  expect_contents(r, ts);
  EXPECT_FALSE(r.sharded());
  EXPECT_EQ(r.files()[0]->metadata(), json({{"format", "pt"}}));
  EXPECT_EQ(r.files()[0]->header_bytes() % 8, 0u);  // data starts 8-byte aligned
  EXPECT_EQ(r.entry("t.F4_E2M1").shape, (Shape{3, 2}));
  EXPECT_EQ(r.entry("t.F4_E2M1").nbytes(), 3u);  // six fp4 elements in three bytes
  // Nothing but the file itself is left in the directory (the temporary was renamed).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(Safetensors, ProducerTensorsAreWrittenLikeDataTensors) {
  ScratchDir dir("produce");
  std::vector<float> vals = {1.f, -2.f, 3.5f};
  TensorToWrite w{"x", DType::F32, {3}, nullptr, [&](void* dst) { std::memcpy(dst, vals.data(), 12); }};
  write_safetensors(dir / "p.safetensors", {w});
  SafetensorsReader r(dir / "p.safetensors");
  EXPECT_EQ(r.view("x").as<float>()[2], 3.5f);
}

TEST(Safetensors, ShardedRoundTripAndIndex) {
  ScratchDir dir("sharded");
  auto ts = every_dtype(11);
  // Each tensor is at most 48 bytes: a 64-byte limit forces several shards.
  auto names = write_safetensors_sharded(dir.path(), to_write(ts), 64);
  ASSERT_GT(names.size(), 2u);
  EXPECT_EQ(names[0], fmt::format("model-00001-of-{:05d}.safetensors", names.size()));
  json index = read_json_file(dir / "model.safetensors.index.json");
  size_t total = 0;
  for (const auto& t : ts) total += t.bytes.size();
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), ts.size());
  for (const auto& name : names) EXPECT_TRUE(fs::exists(dir / name)) << name;
  SafetensorsReader r(dir.path());
  EXPECT_TRUE(r.sharded());
  expect_contents(r, ts);
  for (const auto& t : ts) EXPECT_EQ(r.file_of(t.name).filename().string(), index["weight_map"][t.name]);

  // Re-exporting into one shard removes the index and the stale shards.
  write_safetensors_sharded(dir.path(), to_write(ts), 1 << 20);
  EXPECT_FALSE(fs::exists(dir / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir / names[0]));
  SafetensorsReader r1(dir.path());
  EXPECT_FALSE(r1.sharded());
  expect_contents(r1, ts);
}

TEST(Safetensors, PlanShardsIsGreedyAndKeepsOversizedTensorsAlone) {
  EXPECT_EQ(plan_shards({10, 10, 10, 25, 5}, 20), (std::vector<size_t>{0, 0, 1, 2, 3}));
  EXPECT_EQ(plan_shards({30, 1}, 20), (std::vector<size_t>{0, 1}));
}

TEST(Safetensors, MalformedFilesNameFileAndTensor) {
  ScratchDir dir("bad");
  struct Case {
    const char* what;
    std::string bytes;
    std::vector<std::string> message;
  };
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<Case> cases = {
      {"truncated", std::string("\x10\0\0", 3), {"truncated"}},
      {"header length past end", raw_safetensors("{}", 0, 1000), {"header length 1000", "past the end"}},
      {"invalid json", raw_safetensors("{\"a\":{", 0), {"invalid header JSON"}},
      {"header not an object", raw_safetensors("[1,2]", 0), {"must be an object"}},
      {"unknown dtype",
       raw_safetensors(R"({"w":{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}})", 2),
       {"'w'", "unknown dtype 'F8_E5M2'"}},
      {"offsets backwards",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
       {"'w'", "backwards"}},
      {"size mismatch",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       {"'w'", "span 8 bytes", "needs 12 bytes"}},
      {"past the data",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
       {"'w'", "past the end of the data"}},
      {"overlap",
       raw_safetensors("{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       {"'b'", "overlap tensor 'a'"}},
      {"gap",
       raw_safetensors("{" + ok_entry + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16),
       {"'b'", "gap of 4 bytes"}},
      {"trailing bytes", raw_safetensors("{" + ok_entry + "}", 12), {"4 trailing bytes"}},
      {"duplicate name",
       raw_safetensors("{" + ok_entry + "," + ok_entry + "}", 8),
       {"'a'", "more than once"}},
      {"negative shape",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", 0),
       {"'w'", "non-negative"}},
      {"missing offsets",
       raw_safetensors(R"({"w":{"dtype":"F32","shape":[1]}})", 4),
       {"'w'", "data_offsets"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::string stem = c.what;
    std::replace(stem.begin(), stem.end(), ' ', '_');
    fs::path p = dir / (stem + ".safetensors");
    write_bytes(p, c.bytes);
    auto msg = c.message;
    msg.push_back(p.string());
    expect_error([&] { SafetensorsFile f(p); }, msg);
  }
}

TEST(Safetensors, TruncatedCopyOfARealFileIsRejected) {
  ScratchDir dir("trunc");
  std::string full = read_text_file(test::fixture_dir() / "model.safetensors");
  write_bytes(dir / "cut.safetensors", full.substr(0, full.size() - 100));
  expect_error([&] { SafetensorsFile f(dir / "cut.safetensors"); },
               {(dir / "cut.safetensors").string(), "past the end of the data"});
}

TEST(Safetensors, BrokenIndexNamesShardAndTensor) {
  ScratchDir dir("index");
  auto ts = every_dtype(3);
  auto names = write_safetensors_sharded(dir.path(), to_write(ts), 64);
  const fs::path index_path = dir / "model.safetensors.index.json";
  json index = read_json_file(index_path);

  json missing_shard = index;
  missing_shard["weight_map"]["t.F32"] = "model-00099-of-00099.safetensors";
  write_json_atomic(index_path, missing_shard);
  expect_error([&] { SafetensorsReader r(dir.path()); },
               {index_path.string(), "model-00099-of-00099.safetensors", "t.F32", "does not exist"});

  json missing_tensor = index;
  missing_tensor["weight_map"]["ghost"] = names[0];
  write_json_atomic(index_path, missing_tensor);
  expect_error([&] { SafetensorsReader r(dir.path()); },
               {index_path.string(), "'ghost'", names[0], "does not contain"});

  json wrong_shard = index;
  wrong_shard["weight_map"]["t.F32"] = names[0] == index["weight_map"]["t.F32"] ? names[1] : names[0];
  write_json_atomic(index_path, wrong_shard);
  expect_error([&] { SafetensorsReader r(dir.path()); }, {"'t.F32'", "does not contain"});

  write_text_atomic(index_path, "{\"weight_map\": ");
  expect_error([&] { SafetensorsReader r(dir.path()); }, {index_path.string(), "invalid JSON"});

  // The same tensor stored in two shards.
  write_json_atomic(index_path, index);
  write_safetensors(dir / "extra.safetensors",
                    {{"t.F32", DType::F32, {1}, "\0\0\0\0", {}}, {"dupe", DType::F32, {0}, "", {}}});
  json dup = index;
  dup["weight_map"]["dupe"] = "extra.safetensors";
  write_json_atomic(index_path, dup);
  expect_error([&] { SafetensorsReader r(dir.path()); }, {"'t.F32'", "stored in both"});
}

TEST(Safetensors, LookupOfAbsentTensorNamesIt) {
  SafetensorsReader r(test::fixture_dir() / "model.safetensors");
  expect_error([&] { r.view("no.such.tensor"); }, {"no.such.tensor", "model.safetensors"});
  expect_error([] { SafetensorsReader r("/nonexistent/dir"); }, {"/nonexistent/dir"});
}
