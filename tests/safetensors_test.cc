// safetensors read/write and executor checkpoints: round trips, a file laid
// out as the Python safetensors package writes it, 16-bit conversions, every
// error path, and atomic replacement.
#include "meshflow/io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "meshflow/ops/builder.h"
#include "meshflow/runtime/executor.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("meshflow_st_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes `header` (padded to 8 bytes unless told otherwise) and `data` as a file.
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                        bool pad = true) {
    std::string h = header;
    if (pad) h.append((8 - h.size() % 8) % 8, ' ');
    uint64_t n = h.size();
    std::string bytes(reinterpret_cast<const char*>(&n), 8);
    return write_bytes(name, bytes + h + data);
  }
  std::string write_bytes(const std::string& name, const std::string& bytes) {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }

  fs::path dir_;
};

Tensor make_f32(Shape s, std::vector<float> v) {
  Tensor t(std::move(s), DType::F32);
  MF_CHECK_EQ(static_cast<size_t>(t.numel()), v.size());
  t.copy_from(v.data());
  return t;
}

Tensor make_i32(Shape s, std::vector<int32_t> v) {
  Tensor t(std::move(s), DType::I32);
  MF_CHECK_EQ(static_cast<size_t>(t.numel()), v.size());
  t.copy_from(v.data());
  return t;
}

std::string floats_bytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// The message of a failed Result, or "" (and a test failure) if it succeeded.
template <class T>
std::string error_of(const Result<T>& r) {
  EXPECT_FALSE(r.is_ok()) << "expected an error";
  return r.is_ok() ? "" : r.status().message();
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST_F(Safetensors, RoundTripKeepsValuesShapesDtypesAndMetadata) {
  Tensor w = make_f32(Shape{{"hidden", 2}, {"out", 3}}, {1, -2, 3.5f, 0, 1e-30f, -7});
  Tensor ids = make_i32(Shape{{"seq", 4}}, {0, 7, -1, std::numeric_limits<int32_t>::max()});
  Tensor s = Tensor::scalar(0.25f);
  ASSERT_TRUE(write_safetensors(path("a.safetensors"), {{"w", w}, {"ids", ids}, {"s", s}},
                                {{"step", "12"}, {"format", "pt"}})
                  .is_ok());
  EXPECT_FALSE(fs::exists(path("a.safetensors.tmp")));

  auto r = read_safetensors(path("a.safetensors"));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  ASSERT_EQ(r->tensors.size(), 3u);
  const Tensor& w2 = r->tensors.at("w");
  EXPECT_EQ(w2.shape(), (Shape{{"", 2}, {"", 3}}));  // the file keeps no dim names
  EXPECT_EQ(w2.dtype(), DType::F32);
  EXPECT_EQ(std::memcmp(w2.raw(), w.raw(), w.nbytes()), 0);
  const Tensor& ids2 = r->tensors.at("ids");
  EXPECT_EQ(ids2.dtype(), DType::I32);
  EXPECT_EQ(ids2.shape().sizes(), std::vector<int64_t>{4});
  EXPECT_EQ(std::memcmp(ids2.raw(), ids.raw(), ids.nbytes()), 0);
  EXPECT_EQ(r->tensors.at("s").shape().rank(), 0);
  EXPECT_EQ(*r->tensors.at("s").data<float>(), 0.25f);
  EXPECT_EQ(r->metadata, (std::map<std::string, std::string>{{"step", "12"}, {"format", "pt"}}));
}

TEST_F(Safetensors, WrittenLayoutFollowsTheFormat) {
  Tensor a = make_f32(Shape{{"x", 3}}, {1, 2, 3});
  Tensor b = make_i32(Shape{{"x", 1}, {"y", 2}}, {4, 5});
  ASSERT_TRUE(write_safetensors(path("b.safetensors"), {{"a", a}, {"b", b}}).is_ok());
  std::ifstream in(path("b.safetensors"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "data must start 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + 12 + 8);
  auto h = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["a"]["dtype"], "F32");
  EXPECT_EQ(h["a"]["shape"], nlohmann::json({3}));
  EXPECT_EQ(h["a"]["data_offsets"], nlohmann::json({0, 12}));
  EXPECT_EQ(h["b"]["dtype"], "I32");
  EXPECT_EQ(h["b"]["shape"], nlohmann::json({1, 2}));
  EXPECT_EQ(h["b"]["data_offsets"], nlohmann::json({12, 20}));
  EXPECT_FALSE(h.contains("__metadata__"));
  float a1;
  std::memcpy(&a1, bytes.data() + 8 + n + 4, 4);
  EXPECT_EQ(a1, 2.f);
}

// Byte for byte what `safetensors.torch.save_file({"a": torch.tensor([[1., 2.], [3., 4.]]),
// "ids": torch.tensor([5, 6, 7], dtype=torch.int32)}, f, metadata={"format": "pt"})` writes:
// metadata first, compact JSON, spaces up to a multiple of 8.
TEST_F(Safetensors, ReadsAFileWrittenByPython) {
  const char header[] =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("ids":{"dtype":"I32","shape":[3],"data_offsets":[16,28]}}       )";
  const std::string h(header, sizeof(header) - 1);
  ASSERT_EQ(h.size() % 8, 0u);
  std::string file;
  file += std::string("\x98\x00\x00\x00\x00\x00\x00\x00", 8);
  ASSERT_EQ(h.size(), 0x98u);
  file += h;
  file += std::string("\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40", 16);
  file += std::string("\x05\x00\x00\x00\x06\x00\x00\x00\x07\x00\x00\x00", 12);
  auto r = read_safetensors(write_bytes("py.safetensors", file));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->metadata.at("format"), "pt");
  const Tensor& a = r->tensors.at("a");
  EXPECT_EQ(a.shape().sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(std::vector<float>(a.data<float>(), a.data<float>() + 4),
            (std::vector<float>{1, 2, 3, 4}));
  const Tensor& ids = r->tensors.at("ids");
  EXPECT_EQ(ids.dtype(), DType::I32);
  EXPECT_EQ(std::vector<int32_t>(ids.data<int32_t>(), ids.data<int32_t>() + 3),
            (std::vector<int32_t>{5, 6, 7}));
}

TEST_F(Safetensors, ReadsBF16AndF16AsF32) {
  // bf16: 1.0, -2.5, 3.140625 (the bf16 nearest pi).
  std::vector<uint16_t> bf = {0x3f80, 0xc020, 0x4049};
  // f16: 1.0, -2.0, 65504 (max), 2^-24 (smallest subnormal), 0x0200 (= 2^-15), -0, +inf, 0.5
  std::vector<uint16_t> hf = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x0200, 0x8000, 0x7c00, 0x3800};
  std::string data(reinterpret_cast<const char*>(bf.data()), 6);
  data += std::string(reinterpret_cast<const char*>(hf.data()), 16);
  const std::string header = R"({"b":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]},)"
                             R"("h":{"dtype":"F16","shape":[2,4],"data_offsets":[6,22]}})";
  auto r = read_safetensors(write_raw("half.safetensors", header, data));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const Tensor& b = r->tensors.at("b");
  EXPECT_EQ(b.dtype(), DType::F32);
  EXPECT_EQ(b.data<float>()[0], 1.f);
  EXPECT_EQ(b.data<float>()[1], -2.5f);
  EXPECT_EQ(b.data<float>()[2], 3.140625f);
  const Tensor& h = r->tensors.at("h");
  EXPECT_EQ(h.shape().sizes(), (std::vector<int64_t>{2, 4}));
  const float* p = h.data<float>();
  EXPECT_EQ(p[0], 1.f);
  EXPECT_EQ(p[1], -2.f);
  EXPECT_EQ(p[2], 65504.f);
  EXPECT_EQ(p[3], std::ldexp(1.f, -24));
  EXPECT_EQ(p[4], std::ldexp(1.f, -15));
  EXPECT_EQ(p[5], 0.f);
  EXPECT_TRUE(std::signbit(p[5]));
  EXPECT_TRUE(std::isinf(p[6]) && p[6] > 0);
  EXPECT_EQ(p[7], 0.5f);
}

TEST_F(Safetensors, F16ConversionIsExactForEveryFiniteValue) {
  // Every finite f16 value is exactly representable in f32; compare with a
  // formula evaluation of each bit pattern.
  std::vector<uint16_t> all;
  for (uint32_t b = 0; b < 0x10000; ++b)
    if (((b >> 10) & 0x1f) != 0x1f) all.push_back(static_cast<uint16_t>(b));
  std::string data(reinterpret_cast<const char*>(all.data()), all.size() * 2);
  const std::string n = std::to_string(all.size());
  auto r = read_safetensors(write_raw("all.safetensors",
                                      R"({"h":{"dtype":"F16","shape":[)" + n +
                                          R"(],"data_offsets":[0,)" + std::to_string(data.size()) +
                                          "]}}",
                                      data));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  const float* p = r->tensors.at("h").data<float>();
  for (size_t i = 0; i < all.size(); ++i) {
    const uint16_t b = all[i];
    const int e = (b >> 10) & 0x1f, m = b & 0x3ff;
    float want = e == 0 ? std::ldexp(static_cast<float>(m), -24)
                        : std::ldexp(static_cast<float>(1024 + m), e - 25);
    if (b & 0x8000) want = -want;
    ASSERT_EQ(p[i], want) << "f16 bits 0x" << std::hex << b;
  }
}

// ----- read errors -----

TEST_F(Safetensors, MissingFileAndDirectory) {
  auto r = read_safetensors(path("nope.safetensors"));
  EXPECT_HAS(error_of(r), "nope.safetensors': no such file");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_HAS(error_of(read_safetensors(dir_.string())), "is a directory");
}

TEST_F(Safetensors, TruncatedHeader) {
  EXPECT_HAS(error_of(read_safetensors(write_bytes("t.safetensors", "abc"))),
             "file is 3 bytes, too short for the 8-byte header length");
  // Header length says 64 bytes, only 10 follow.
  std::string bytes("\x40\x00\x00\x00\x00\x00\x00\x00", 8);
  const std::string msg =
      error_of(read_safetensors(write_bytes("t.safetensors", bytes + R"({"a":{"dt)")));
  EXPECT_HAS(msg, "t.safetensors");
  EXPECT_HAS(msg, "header length 64 runs past the end of the file (17 bytes): truncated header");
  // A huge length is not a safetensors file at all (e.g. a text file).
  EXPECT_HAS(error_of(read_safetensors(write_bytes("t.safetensors", "hello world, not a tensor"))),
             "not a safetensors file?");
}

TEST_F(Safetensors, BadJson) {
  std::string msg =
      error_of(read_safetensors(write_raw("j.safetensors", R"({"a": {"dtype": )", "")));
  EXPECT_HAS(msg, "safetensors '" + path("j.safetensors") + "': header is not valid JSON");
  EXPECT_HAS(error_of(read_safetensors(write_raw("j.safetensors", "[1, 2]", ""))),
             "header must be a JSON object");
  EXPECT_HAS(error_of(read_safetensors(
                 write_raw("j.safetensors", R"({"a":{"dtype":"F32","shape":[1]}})", "xxxx"))),
             "tensor 'a': entry has no \"data_offsets\"");
  EXPECT_HAS(error_of(read_safetensors(write_raw(
                 "j.safetensors",
                 R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", "xxxx"))),
             "unexpected field \"extra\"");
  EXPECT_HAS(
      error_of(read_safetensors(write_raw(
          "j.safetensors", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx"))),
      "non-integer dim");
  EXPECT_HAS(
      error_of(read_safetensors(write_raw(
          "j.safetensors", R"({"a":{"dtype":"F32","shape":[2,0],"data_offsets":[0,0]}})", ""))),
      "has a dim of size 0");
  EXPECT_HAS(
      error_of(read_safetensors(write_raw(
          "j.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "xxxx"))),
      "data_offsets must be [begin, end]");
  EXPECT_HAS(
      error_of(read_safetensors(write_raw("j.safetensors", R"({"__metadata__":{"step":3}})", ""))),
      "__metadata__ value of 'step' must be a string, got 3");
  EXPECT_HAS(error_of(read_safetensors(
                 write_raw("j.safetensors",
                           R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           "xxxxxxxx"))),
             "header names tensor 'a' twice");
}

TEST_F(Safetensors, UnsupportedDtypeListsTheSupportedOnes) {
  const std::string msg = error_of(read_safetensors(write_raw(
      "d.safetensors", R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", "12345678")));
  EXPECT_HAS(msg, "tensor 'w': dtype F64 is not supported (supported: F32, I32, BF16, F16)");
  EXPECT_HAS(
      error_of(read_safetensors(write_raw(
          "d.safetensors", R"({"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", "1"))),
      "unknown dtype 'Q4' (supported: F32, I32, BF16, F16)");
}

TEST_F(Safetensors, OffsetsOutOfRangeSizeMismatchAndOverlap) {
  // Data section truncated: the tensor needs 16 bytes, 8 are there.
  std::string msg = error_of(read_safetensors(write_raw(
      "o.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "12345678")));
  EXPECT_HAS(msg,
             "tensor 'w': data_offsets [0, 16) run past the end of the data section (8 bytes)");
  msg = error_of(read_safetensors(
      write_raw("o.safetensors", R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
                std::string(24, 'x'))));
  EXPECT_HAS(msg, "tensor 'w': F32[2,3] needs 24 bytes but data_offsets [0, 20) span 20");
  msg = error_of(read_safetensors(
      write_raw("o.safetensors", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                std::string(8, 'x'))));
  EXPECT_HAS(msg, "data_offsets [8, 4) end before they begin");
  msg = error_of(
      read_safetensors(write_raw("o.safetensors",
                                 R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})",
                                 std::string(12, 'x'))));
  EXPECT_HAS(msg, "tensors 'a' [0, 8) and 'b' [4, 12) overlap");
}

TEST_F(Safetensors, HeaderWithoutPaddingAndEmptyFileAreValid) {
  auto r = read_safetensors(write_raw("p.safetensors",
                                      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                      floats_bytes({9}), /*pad=*/false));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r->tensors.at("a").data<float>(), 9.f);
  ASSERT_TRUE(write_safetensors(path("empty.safetensors"), {}).is_ok());
  auto e = read_safetensors(path("empty.safetensors"));
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  EXPECT_TRUE(e->tensors.empty());
}

// ----- write errors and atomicity -----

TEST_F(Safetensors, WriteRejectsBadTensors) {
  Tensor t = make_f32(Shape{{"x", 1}}, {1});
  EXPECT_HAS(write_safetensors(path("w.safetensors"), {{"a", t}, {"a", t}}).message(),
             "tensor 'a' appears twice");
  EXPECT_HAS(write_safetensors(path("w.safetensors"), {{"__metadata__", t}}).message(),
             "reserved name");
  EXPECT_HAS(write_safetensors(path("w.safetensors"), {{"a", Tensor()}}).message(),
             "tensor 'a' has no data");
  EXPECT_HAS(write_safetensors(path("w.safetensors"), {{"h", Tensor(Shape{{"x", 2}}, DType::BF16)}})
                 .message(),
             "tensor 'h' is bf16; only f32 and i32 are written");
  EXPECT_FALSE(fs::exists(path("w.safetensors")));
}

TEST_F(Safetensors, WriteIntoMissingDirectoryFailsCleanly) {
  Tensor t = make_f32(Shape{{"x", 1}}, {1});
  const std::string p = path("no/such/dir/w.safetensors");
  Status s = write_safetensors(p, {{"a", t}});
  EXPECT_FALSE(s.is_ok());
  EXPECT_HAS(s.message(), "cannot create '" + p + ".tmp'");
  EXPECT_HAS(s.message(), "No such file or directory");
  EXPECT_FALSE(fs::exists(path("no")));
}

TEST_F(Safetensors, FailedWriteLeavesTheOldFileIntact) {
  const std::string p = path("ckpt.safetensors");
  ASSERT_TRUE(write_safetensors(p, {{"a", make_f32(Shape{{"x", 2}}, {1, 2})}}).is_ok());
  // The temporary file cannot be created (a directory sits at its path): the
  // write fails before touching the old checkpoint.
  fs::create_directory(p + ".tmp");
  Status s = write_safetensors(p, {{"a", make_f32(Shape{{"x", 3}}, {7, 8, 9})}});
  EXPECT_FALSE(s.is_ok());
  EXPECT_HAS(s.message(), p + ".tmp");
  fs::remove(p + ".tmp");
  // The data reaches the .tmp but the rename fails (the target is a non-empty
  // directory): the error says so and the .tmp is cleaned up.
  const std::string sub = path("sub");
  fs::create_directory(sub);
  fs::create_directory(sub + "/x.safetensors");
  std::ofstream(sub + "/x.safetensors/keep") << "x";
  s = write_safetensors(sub + "/x.safetensors", {{"a", make_f32(Shape{{"x", 1}}, {1})}});
  EXPECT_FALSE(s.is_ok());
  EXPECT_HAS(s.message(), "cannot rename '" + sub + "/x.safetensors.tmp' to '" + sub +
                              "/x.safetensors': Is a directory");
  EXPECT_FALSE(fs::exists(sub + "/x.safetensors.tmp"));

  auto r = read_safetensors(p);
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->tensors.at("a").numel(), 2);
  EXPECT_EQ(r->tensors.at("a").data<float>()[1], 2.f);
  // A successful write replaces it.
  ASSERT_TRUE(write_safetensors(p, {{"a", make_f32(Shape{{"x", 3}}, {7, 8, 9})}}).is_ok());
  EXPECT_EQ(value_or_throw(read_safetensors(p)).tensors.at("a").numel(), 3);
}

TEST_F(Safetensors, StaleTmpFromACrashIsOverwritten) {
  const std::string p = path("c.safetensors");
  std::ofstream(p + ".tmp") << "half a checkpoint from a crashed run";
  ASSERT_TRUE(write_safetensors(p, {{"a", make_f32(Shape{{"x", 1}}, {5})}}).is_ok());
  EXPECT_FALSE(fs::exists(p + ".tmp"));
  EXPECT_EQ(*value_or_throw(read_safetensors(p)).tensors.at("a").data<float>(), 5.f);
}

// ----- executor checkpoints -----

ExecutorOptions seeded(uint64_t seed) {
  ExecutorOptions o;
  o.seed = seed;
  return o;
}

// Two parameters, an optimizer-state value and an input: enough to exercise
// names, shapes and the state option (no compute nodes are needed).
void build_model(Graph& g, int64_t hidden) {
  Builder b(g);
  b.parameter("h.0.ln_1.weight", Shape{{"hidden", hidden}}, Init::ones());
  b.parameter("h.0.attn.w", Shape{{"hidden", hidden}, {"out", 3}}, Init::normal(0.5f));
  b.state("adam.m.h.0.attn.w", Shape{{"hidden", hidden}, {"out", 3}});
  b.input("tokens", Shape{{"batch", 2}}, DType::I32);
}

TEST_F(Safetensors, CheckpointRoundTrip) {
  Graph g;
  build_model(g, 4);
  Executor a(g, seeded(1)), b(g, seeded(2));
  const ValueId w = g.find("h.0.attn.w");
  ASSERT_NE(std::memcmp(a.storage(w).raw(), b.storage(w).raw(), a.storage(w).nbytes()), 0);
  ASSERT_TRUE(save_parameters(a, path("m.safetensors"), {{"step", "5"}}).is_ok());
  auto meta = load_parameters(b, path("m.safetensors"));
  ASSERT_TRUE(meta.is_ok()) << meta.status().message();
  EXPECT_EQ(meta->at("step"), "5");
  for (ValueId v : g.parameters())
    EXPECT_EQ(std::memcmp(a.storage(v).raw(), b.storage(v).raw(), a.storage(v).nbytes()), 0)
        << g.value(v).name;
  // The file holds parameters only, not state or inputs.
  auto f = value_or_throw(read_safetensors(path("m.safetensors")));
  EXPECT_EQ(f.tensors.size(), 2u);
}

TEST_F(Safetensors, CheckpointWithOptimizerState) {
  Graph g;
  build_model(g, 4);
  Executor a(g, seeded(1)), b(g, seeded(2));
  const ValueId m = g.find("adam.m.h.0.attn.w");
  a.storage(m).data<float>()[5] = 3.f;
  const CheckpointOptions with_state{.optimizer_state = true};
  ASSERT_TRUE(save_parameters(a, path("s.safetensors"), {}, with_state).is_ok());
  ASSERT_TRUE(load_parameters(b, path("s.safetensors"), with_state).is_ok());
  EXPECT_EQ(b.storage(m).data<float>()[5], 3.f);
  // Loading it as parameters only: the state tensor is extra, and the message says why.
  const std::string msg = error_of(load_parameters(b, path("s.safetensors")));
  EXPECT_HAS(msg, "tensor 'adam.m.h.0.attn.w' in the file matches no parameter of the model");
  EXPECT_HAS(msg, "optimizer_state = true");
  // A parameters-only file lacks the state.
  ASSERT_TRUE(save_parameters(a, path("p.safetensors")).is_ok());
  EXPECT_HAS(error_of(load_parameters(b, path("p.safetensors"), with_state)),
             "optimizer state 'adam.m.h.0.attn.w' is missing from the file");
}

TEST_F(Safetensors, CheckpointShapeMismatchNamesParameterAndShapes) {
  Graph small, big;
  build_model(small, 256);
  build_model(big, 512);
  Executor a(small), b(big, seeded(3));
  const ValueId w = big.find("h.0.attn.w");
  const float before = b.storage(w).data<float>()[0];
  const std::string p = path("x.safetensors");
  ASSERT_TRUE(save_parameters(a, p).is_ok());
  EXPECT_HAS(error_of(load_parameters(b, p)),
             "checkpoint '" + p +
                 "': parameter 'h.0.ln_1.weight' has shape [256] in the file but [512] in the "
                 "model");
  EXPECT_EQ(b.storage(w).data<float>()[0], before) << "a failed load must change nothing";
}

TEST_F(Safetensors, CheckpointMissingExtraAndWrongDtype) {
  Graph g;
  build_model(g, 4);
  Executor ex(g, seeded(1));
  Tensor ln = ex.storage(g.find("h.0.ln_1.weight"));
  Tensor w = ex.storage(g.find("h.0.attn.w"));
  const std::string p = path("c.safetensors");

  ASSERT_TRUE(write_safetensors(p, {{"h.0.ln_1.weight", ln}}).is_ok());
  auto r = load_parameters(ex, p);
  EXPECT_HAS(error_of(r),
             "checkpoint '" + p + "': parameter 'h.0.attn.w' is missing from the file");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);

  ASSERT_TRUE(write_safetensors(p, {}).is_ok());
  EXPECT_HAS(error_of(load_parameters(ex, p)),
             "parameter 'h.0.ln_1.weight' (and 1 more: 'h.0.attn.w') is missing from the file");

  ASSERT_TRUE(
      write_safetensors(p, {{"h.0.ln_1.weight", ln}, {"h.0.attn.w", w}, {"lm_head.weight", w}})
          .is_ok());
  EXPECT_HAS(error_of(load_parameters(ex, p)),
             "tensor 'lm_head.weight' in the file matches no parameter of the model");

  ASSERT_TRUE(write_safetensors(p, {{"h.0.ln_1.weight", make_i32(Shape{{"x", 4}}, {1, 2, 3, 4})},
                                    {"h.0.attn.w", w}})
                  .is_ok());
  EXPECT_HAS(error_of(load_parameters(ex, p)),
             "parameter 'h.0.ln_1.weight' is i32 in the file but f32 in the model");

  EXPECT_HAS(error_of(load_parameters(ex, path("absent.safetensors"))), "no such file");
}

}  // namespace
}  // namespace meshflow
