// Datasets: shapes, determinism by (seed, step, micro), rank shards that
// concatenate to the global batch, fixed eval batches, the epoch shuffle,
// Fashion-MNIST and fortunes from the Debian packages (skipped when absent),
// and the errors for missing or corrupt files.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "meshflow/data/fashion_mnist.h"
#include "meshflow/data/text.h"
#include "meshflow/runtime/run_config.h"

namespace meshflow {
namespace {

::testing::AssertionResult HasSubstr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << text << "' does not contain '" << part << "'";
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

bool same_batch(const Batch& a, const Batch& b) {
  if (a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i)
    if (a.tensors[i].first != b.tensors[i].first ||
        !same_bytes(a.tensors[i].second, b.tensors[i].second))
      return false;
  return true;
}

// Rows [first, first + n) of a global batch tensor equal a shard's tensor.
bool rows_equal(const Tensor& global, int64_t first, const Tensor& shard) {
  const int64_t row_bytes = static_cast<int64_t>(global.nbytes()) / global.shape().size(0);
  return std::memcmp(static_cast<const char*>(global.raw()) + first * row_bytes, shard.raw(),
                     shard.nbytes()) == 0;
}

void expect_shards_tile_the_batch(const Batch& global, const std::vector<Batch>& shards) {
  int64_t first = 0;
  for (const Batch& s : shards) {
    for (size_t i = 0; i < s.tensors.size(); ++i)
      EXPECT_TRUE(rows_equal(global.tensors[i].second, first, s.tensors[i].second))
          << s.tensors[i].first << " rows from " << first;
    first += s.rows;
  }
  EXPECT_EQ(first, global.rows);
}

// ---------------------------------------------------------------- shuffle

TEST(DataShuffle, IsABijection) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    std::vector<char> seen(n, 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = shuffled_index(i, n, 12345);
      ASSERT_GE(j, 0);
      ASSERT_LT(j, n);
      EXPECT_FALSE(seen[j]) << "n=" << n << " maps two indices to " << j;
      seen[j] = 1;
    }
  }
  // Different keys give different orders.
  int same = 0;
  for (int64_t i = 0; i < 1000; ++i)
    same += shuffled_index(i, 1000, 1) == shuffled_index(i, 1000, 2);
  EXPECT_LT(same, 20);
}

// ---------------------------------------------------------------- text

std::vector<std::string> toy_documents() {
  std::vector<std::string> docs;
  for (int i = 0; i < 200; ++i)
    docs.push_back("document " + std::to_string(i) + ": the quick brown fox jumps over it.\n");
  return docs;
}

TEST(DataText, SplitFortunes) {
  auto f = split_fortunes("one\nline\n%\n\n%\ntwo\n%\r\nthree");
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0], "one\nline\n");
  EXPECT_EQ(f[1], "two\n");
  EXPECT_EQ(f[2], "three");
}

TEST(DataText, BatchShapesAndShiftedTargets) {
  TextOptions o;
  o.seq_len = 16;
  o.eval_fraction = 0.1;
  TextDataset ds = value_or_throw(TextDataset::from_documents(toy_documents(), o));
  EXPECT_EQ(ds.input_names(), (std::vector<std::string>{"tokens", "targets"}));
  EXPECT_GT(ds.eval_text().size(), 0u);
  EXPECT_GT(ds.train_text().size(), 10 * ds.eval_text().size() / 2);
  Batch b = value_or_throw(ds.train_batch({.seed = 1, .step = 0}, 8));
  const Tensor& tokens = b.get("tokens");
  const Tensor& targets = b.get("targets");
  EXPECT_EQ(tokens.shape().to_string(), "[batch=8,seq=16]");
  EXPECT_EQ(tokens.dtype(), DType::I32);
  for (int64_t r = 0; r < 8; ++r)
    for (int64_t t = 0; t + 1 < 16; ++t)
      EXPECT_EQ(tokens.data<int32_t>()[r * 16 + t + 1], targets.data<int32_t>()[r * 16 + t]);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    EXPECT_GE(tokens.data<int32_t>()[i], 0);
    EXPECT_LT(tokens.data<int32_t>()[i], 256);
  }
  // The window is a real substring of the training text.
  std::string window;
  for (int64_t t = 0; t < 16; ++t) window += static_cast<char>(tokens.data<int32_t>()[t]);
  window += static_cast<char>(targets.data<int32_t>()[15]);
  EXPECT_NE(ds.train_text().find(window), std::string::npos) << window;
}

TEST(DataText, DeterministicByIndexAndShardsTileTheBatch) {
  TextOptions o;
  o.seq_len = 8;
  TextDataset ds = value_or_throw(TextDataset::from_documents(toy_documents(), o));
  const BatchIndex at{.seed = 3, .step = 5, .micro = 1, .micro_batches = 2};
  Batch a = value_or_throw(ds.train_batch(at, 12));
  EXPECT_TRUE(same_batch(a, value_or_throw(ds.train_batch(at, 12))));
  EXPECT_FALSE(same_batch(a, value_or_throw(ds.train_batch(
                                 {.seed = 3, .step = 6, .micro = 1, .micro_batches = 2}, 12))));
  EXPECT_FALSE(same_batch(a, value_or_throw(ds.train_batch(
                                 {.seed = 4, .step = 5, .micro = 1, .micro_batches = 2}, 12))));
  EXPECT_FALSE(same_batch(a, value_or_throw(ds.train_batch(
                                 {.seed = 3, .step = 5, .micro = 0, .micro_batches = 2}, 12))));
  std::vector<Batch> shards;
  for (int r = 0; r < 3; ++r) shards.push_back(value_or_throw(ds.train_batch(at, 12, Shard{r, 3})));
  EXPECT_EQ(shards[0].get("tokens").shape().to_string(), "[batch=4,seq=8]");
  expect_shards_tile_the_batch(a, shards);

  auto bad = ds.train_batch(at, 12, Shard{0, 5});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_TRUE(
      HasSubstr(bad.status().message(), "global batch 12 is not divisible by world size 5"));
  EXPECT_FALSE(ds.train_batch({.step = 0, .micro = 2, .micro_batches = 2}, 12).is_ok());
}

TEST(DataText, EvalBatchesAreFixedWindows) {
  TextOptions o;
  o.seq_len = 8;
  o.eval_fraction = 0.2;
  TextDataset ds = value_or_throw(TextDataset::from_documents(toy_documents(), o));
  const int64_t windows = (static_cast<int64_t>(ds.eval_text().size()) - 1) / 8;
  EXPECT_EQ(ds.eval_examples(), windows);
  EXPECT_EQ(ds.num_eval_batches(4), windows / 4);
  ASSERT_GE(ds.num_eval_batches(4), 2);
  Batch e1 = value_or_throw(ds.eval_batch(1, 4));
  // Window 4 (first row of batch 1) starts at byte 32 of the eval text.
  for (int64_t t = 0; t < 8; ++t)
    EXPECT_EQ(e1.get("tokens").data<int32_t>()[t],
              static_cast<unsigned char>(ds.eval_text()[32 + t]));
  std::vector<Batch> shards = {value_or_throw(ds.eval_batch(1, 4, Shard{0, 2})),
                               value_or_throw(ds.eval_batch(1, 4, Shard{1, 2}))};
  expect_shards_tile_the_batch(e1, shards);
  int64_t n = 0;
  for (EvalIterator it = ds.eval(4, {}, 3); !it.done(); ++n) {
    const int64_t i = it.index();
    EXPECT_TRUE(same_batch(it.next(), value_or_throw(ds.eval_batch(i, 4))));
  }
  EXPECT_EQ(n, 3);
  EvalIterator bad = ds.eval(5, Shard{0, 2});
  EXPECT_TRUE(bad.done());
  EXPECT_FALSE(bad.status().is_ok());
  EXPECT_FALSE(ds.eval_batch(ds.num_eval_batches(4), 4).is_ok());
  // Whole batches as micro-batches (evaluation under micro-batching): each
  // pair of 2-row micro-batches tiles one 4-row batch, and the count stops at
  // the whole batches (not at the more 2-row batches the set would hold).
  EvalIterator micro = ds.eval_as_micro_batches(4, 2, 3);
  EXPECT_EQ(micro.count(), 6);
  for (int64_t b = 0; !micro.done(); ++b) {
    std::vector<Batch> halves = {micro.next(), micro.next()};
    expect_shards_tile_the_batch(value_or_throw(ds.eval_batch(b, 4)), halves);
  }
  EXPECT_EQ(ds.eval_as_micro_batches(4, 2, -1).count(), 2 * ds.num_eval_batches(4));
}

TEST(DataText, SplitIsStableAndSeeded) {
  TextOptions o;
  o.seq_len = 8;
  o.eval_fraction = 0.3;
  TextDataset a = value_or_throw(TextDataset::from_documents(toy_documents(), o));
  TextDataset b = value_or_throw(TextDataset::from_documents(toy_documents(), o));
  EXPECT_EQ(a.eval_text(), b.eval_text());
  o.split_seed = 9;
  TextDataset c = value_or_throw(TextDataset::from_documents(toy_documents(), o));
  EXPECT_NE(a.eval_text(), c.eval_text());
  EXPECT_EQ(a.train_text().size() + a.eval_text().size(),
            c.train_text().size() + c.eval_text().size());
}

TEST(DataText, Fortunes) {
  TextOptions o;
  if (!std::filesystem::exists(o.dir))
    GTEST_SKIP() << o.dir << " not installed (Debian package fortunes)";
  o.seq_len = 64;
  TextDataset ds = value_or_throw(TextDataset::from_fortunes(o));
  EXPECT_GT(ds.documents(), 1000);
  EXPECT_EQ(ds.train_text().find('\0'), std::string::npos);
  const double eval_share =
      static_cast<double>(ds.eval_text().size()) / (ds.train_text().size() + ds.eval_text().size());
  EXPECT_GT(eval_share, 0.02);
  EXPECT_LT(eval_share, 0.10);
  EXPECT_GT(ds.num_eval_batches(16), 10);
  Batch b = value_or_throw(ds.train_batch({.seed = 0, .step = 0}, 4));
  EXPECT_EQ(b.get("targets").shape().to_string(), "[batch=4,seq=64]");
  EXPECT_TRUE(HasSubstr(ds.describe(), "vocab 256")) << ds.describe();
}

TEST(DataText, MissingDirectoryNamesThePackage) {
  TextOptions o;
  o.dir = "/nonexistent/fortunes";
  auto r = TextDataset::from_fortunes(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(HasSubstr(r.status().message(), "/nonexistent/fortunes"));
  EXPECT_TRUE(HasSubstr(r.status().message(), "Debian package 'fortunes'"));
}

TEST(DataText, TooShortForOneWindow) {
  TextOptions o;
  o.seq_len = 100;
  auto r = TextDataset::from_documents({"tiny"}, o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(HasSubstr(r.status().message(), "fewer than one window"));
}

// ---------------------------------------------------------------- fashion-mnist

const FashionMnist* fashion_mnist() {  // loaded once for the suite (~0.5 s)
  static const Result<FashionMnist>* ds = [] {
    FashionMnistOptions o;
    o.validation = 5000;
    return new Result<FashionMnist>(FashionMnist::load(o));
  }();
  return ds->is_ok() ? &ds->value() : nullptr;
}
#define REQUIRE_FASHION_MNIST()                                                           \
  if (!std::filesystem::exists(FashionMnistOptions{}.dir))                                \
    GTEST_SKIP() << "Fashion-MNIST not installed (Debian package dataset-fashion-mnist)"; \
  ASSERT_NE(fashion_mnist(), nullptr)

// Augmentation (data.augment): each training image is the original shifted by
// at most crop_padding pixels (zeros come in) and mirrored half the time;
// the same (seed, step) gives the same batch; labels are untouched.
TEST(DataFashionMnist, AugmentationCropsAndFlipsDeterministically) {
  REQUIRE_FASHION_MNIST();
  FashionMnistOptions o;
  o.validation = 5000;
  o.crop_padding = 2;
  o.flip = true;
  const FashionMnist aug = value_or_throw(FashionMnist::load(o));
  const FashionMnist& plain = *fashion_mnist();
  const BatchIndex at{.seed = 3, .step = 5};
  const Batch a = value_or_throw(aug.train_batch(at, 64));
  EXPECT_TRUE(same_batch(a, value_or_throw(aug.train_batch(at, 64))));
  const Batch p = value_or_throw(plain.train_batch(at, 64));
  int changed = 0, flipped = 0;
  for (int64_t row = 0; row < 64; ++row) {
    ASSERT_EQ(a.get("labels").data<int32_t>()[row], p.get("labels").data<int32_t>()[row]);
    const float* x = a.get("x").data<float>() + row * 784;
    const float* y = p.get("x").data<float>() + row * 784;
    // Find the shift (and flip) that maps the original onto the augmented image.
    bool found = false;
    for (int flip = 0; flip < 2 && !found; ++flip)
      for (int sr = -2; sr <= 2 && !found; ++sr)
        for (int sc = -2; sc <= 2 && !found; ++sc) {
          bool ok = true;
          for (int i = 0; i < 28 && ok; ++i)
            for (int j = 0; j < 28 && ok; ++j) {
              const int r = i + sr, c0 = j + sc, c = flip ? 27 - c0 : c0;
              const float want = r >= 0 && r < 28 && c0 >= 0 && c0 < 28 ? y[r * 28 + c] : 0.f;
              ok = x[i * 28 + j] == want;
            }
          if (ok) {
            found = true;
            changed += sr != 0 || sc != 0 || flip;
            flipped += flip;
          }
        }
    EXPECT_TRUE(found) << "row " << row << " is no shift of at most 2 (and flip) of the original";
  }
  EXPECT_GT(changed, 40);  // of 64: nearly all are moved or mirrored
  EXPECT_GT(flipped, 16);
  EXPECT_LT(flipped, 48);
  // Evaluation images are never augmented.
  EvalIterator ea = aug.eval(8), ep = plain.eval(8);
  EXPECT_TRUE(same_batch(ea.next(), ep.next()));
}

TEST(DataFashionMnist, SizesAndShapes) {
  REQUIRE_FASHION_MNIST();
  const FashionMnist& ds = *fashion_mnist();
  EXPECT_EQ(ds.train_examples(), 55000);
  EXPECT_EQ(ds.eval_examples(), 10000);
  Batch b = value_or_throw(ds.train_batch({.seed = 0, .step = 0}, 32));
  EXPECT_EQ(b.get("x").shape().to_string(), "[batch=32,features=784]");
  EXPECT_EQ(b.get("labels").shape().to_string(), "[batch=32]");
  EXPECT_EQ(b.get("labels").dtype(), DType::I32);
  float lo = 1, hi = 0;
  for (int64_t i = 0; i < b.get("x").numel(); ++i) {
    lo = std::min(lo, b.get("x").data<float>()[i]);
    hi = std::max(hi, b.get("x").data<float>()[i]);
  }
  EXPECT_EQ(lo, 0.f);
  EXPECT_LE(hi, 1.f);
  EXPECT_GT(hi, 0.9f);
  for (int64_t i = 0; i < 32; ++i) {
    EXPECT_GE(b.get("labels").data<int32_t>()[i], 0);
    EXPECT_LT(b.get("labels").data<int32_t>()[i], 10);
  }
}

TEST(DataFashionMnist, AnEpochSeesEveryImageOnce) {
  REQUIRE_FASHION_MNIST();
  const FashionMnist& ds = *fashion_mnist();
  // 55000 training images = 55 steps of 1000 (one epoch); count the pixel sums
  // of every image drawn: an epoch is a permutation iff the multiset matches
  // the one of a second epoch with another shuffle, and labels are near balanced.
  auto epoch_signature = [&](int64_t first_step) {
    std::multiset<int64_t> sums;
    std::vector<int64_t> per_class(10, 0);
    for (int64_t s = first_step; s < first_step + 55; ++s) {
      Batch b = value_or_throw(ds.train_batch({.seed = 7, .step = s}, 1000));
      for (int64_t r = 0; r < 1000; ++r) {
        double sum = 0;
        for (int64_t k = 0; k < 784; ++k) sum += b.get("x").data<float>()[r * 784 + k];
        sums.insert(std::llround(sum * 255));
        ++per_class[b.get("labels").data<int32_t>()[r]];
      }
    }
    return std::make_pair(sums, per_class);
  };
  auto [e0, classes0] = epoch_signature(0);
  auto [e1, classes1] = epoch_signature(55);
  EXPECT_TRUE(e0 == e1) << "epoch 0 and epoch 1 should hold the same images";
  EXPECT_EQ(classes0, classes1);
  for (int64_t c : classes0) EXPECT_NEAR(c, 5500, 200);
  Batch first0 = value_or_throw(ds.train_batch({.seed = 7, .step = 0}, 1000));
  Batch first1 = value_or_throw(ds.train_batch({.seed = 7, .step = 55}, 1000));
  EXPECT_FALSE(same_batch(first0, first1)) << "each epoch should have its own order";
}

TEST(DataFashionMnist, ShardsAndEval) {
  REQUIRE_FASHION_MNIST();
  const FashionMnist& ds = *fashion_mnist();
  const BatchIndex at{.seed = 1, .step = 3};
  Batch g = value_or_throw(ds.train_batch(at, 64));
  std::vector<Batch> shards;
  for (int r = 0; r < 4; ++r) shards.push_back(value_or_throw(ds.train_batch(at, 64, Shard{r, 4})));
  expect_shards_tile_the_batch(g, shards);
  EXPECT_EQ(ds.num_eval_batches(1000), 10);
  EXPECT_TRUE(
      same_batch(value_or_throw(ds.eval_batch(2, 1000)), value_or_throw(ds.eval_batch(2, 1000))));
}

TEST(DataFashionMnist, NormalizeAndValidationSplit) {
  REQUIRE_FASHION_MNIST();
  FashionMnistOptions o;
  o.validation = 10000;
  o.eval_on_validation = true;
  o.normalize = true;
  FashionMnist ds = value_or_throw(FashionMnist::load(o));
  EXPECT_EQ(ds.train_examples(), 50000);
  EXPECT_EQ(ds.eval_examples(), 10000);
  EXPECT_NEAR(ds.mean(), 0.286, 0.01);
  EXPECT_NEAR(ds.stddev(), 0.353, 0.01);
  Batch b = value_or_throw(ds.train_batch({}, 2000));
  double sum = 0, sq = 0;
  const Tensor& x = b.get("x");
  for (int64_t i = 0; i < x.numel(); ++i) {
    sum += x.data<float>()[i];
    sq += x.data<float>()[i] * x.data<float>()[i];
  }
  EXPECT_NEAR(sum / x.numel(), 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(sq / x.numel()), 1.0, 0.05);
}

TEST(DataFashionMnist, MissingFileNamesPathAndPackage) {
  FashionMnistOptions o;
  o.dir = "/nonexistent/fashion-mnist";
  auto r = FashionMnist::load(o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(
      HasSubstr(r.status().message(), "/nonexistent/fashion-mnist/train-images-idx3-ubyte.gz"));
  EXPECT_TRUE(HasSubstr(r.status().message(), "dataset-fashion-mnist"));
}

TEST(DataFashionMnist, CorruptIdxFiles) {
  const std::string path =
      ::testing::TempDir() + "meshflow_idx_" + std::to_string(getpid()) + ".gz";
  auto write_gz = [&](const std::vector<unsigned char>& bytes) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  };
  write_gz({0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9});  // a valid 1-D file of 3 bytes
  auto ok = read_idx_gz(path, {3});
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(ok.value(), (std::vector<uint8_t>{7, 8, 9}));
  write_gz({0, 0, 9, 1, 0, 0, 0, 3, 7, 8, 9});  // wrong type byte
  EXPECT_TRUE(
      HasSubstr(read_idx_gz(path, {3}).status().message(), "not an unsigned-byte IDX file"));
  write_gz({0, 0, 8, 1, 0, 0, 0, 4, 7, 8, 9});  // declares 4 bytes, has 3
  EXPECT_TRUE(HasSubstr(read_idx_gz(path, {0}).status().message(), "is truncated"));
  write_gz({0, 0, 8, 1, 0, 0, 0, 2, 7, 8, 9});  // trailing byte
  EXPECT_TRUE(HasSubstr(read_idx_gz(path, {0}).status().message(), "has data after"));
  write_gz({0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9});
  EXPECT_TRUE(HasSubstr(read_idx_gz(path, {5}).status().message(), "expected 5"));
  EXPECT_TRUE(
      HasSubstr(read_idx_gz(path, {0, 28, 28}).status().message(), "has 1 dims, expected 3"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace meshflow

namespace meshflow {
namespace {

// data.augment: keys checked, and only for a dataset of images.
TEST(DataConfigAugment, KeysAndDatasetAreChecked) {
  auto parse = [](const json& data) {
    const json doc = {{"model", {{"type", "mlp"}, {"input_dim", 784}, {"num_classes", 10}}},
                      {"data", data}};
    return parse_run_config(doc, "").status();
  };
  EXPECT_TRUE(
      parse({{"dataset", "fashion_mnist"}, {"augment", {{"crop_padding", 2}, {"flip", true}}}})
          .is_ok());
  Status s = parse({{"dataset", "fortunes"}, {"augment", {{"flip", true}}}});
  EXPECT_TRUE(HasSubstr(s.message(), "data.augment transforms images")) << s.message();
  s = parse({{"dataset", "fashion_mnist"}, {"augment", {{"crop_padding", 20}}}});
  EXPECT_TRUE(HasSubstr(s.message(), "crop_padding")) << s.message();
  s = parse({{"dataset", "fashion_mnist"}, {"augment", {{"flips", true}}}});
  EXPECT_TRUE(HasSubstr(s.message(), "flips")) << s.message();
}

}  // namespace
}  // namespace meshflow
