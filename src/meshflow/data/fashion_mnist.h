// Fashion-MNIST from Debian's dataset-fashion-mnist package: 28x28 grey
// images of clothing in 10 classes, read from the IDX .gz files in
// /usr/share/datasets/fashion-mnist (train-*: 60000, t10k-*: 10000).
//
//   MF_ASSIGN_OR_RETURN(FashionMnist ds, FashionMnist::load({.validation = 5000}));
//   Batch b = value_or_throw(ds.train_batch({.seed = 0, .step = 3}, 64));
//   b.get("x")       // [batch, features=784] f32, pixels / 255 (optionally normalized)
//   b.get("labels")  // [batch] i32 in [0, 10)
//
// Training order: epoch e of the training split is a shuffle of it keyed by
// (seed, e) (see shuffled_index), so each image is seen once per epoch.
// Images stay uint8 in memory (47 MB) and become f32 per batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/data/dataset.h"

namespace meshflow {

struct FashionMnistOptions {
  std::string dir = "/usr/share/datasets/fashion-mnist";
  // The last `validation` images of the train file are held out of training.
  int64_t validation = 0;
  // Eval on the held-out validation images instead of the 10k test file.
  bool eval_on_validation = false;
  // Subtract the training split's pixel mean and divide by its std (after /255).
  bool normalize = false;
  // Training images only: a random crop of the image zero-padded by
  // crop_padding on each side (a shift of up to crop_padding pixels), and a
  // horizontal flip half the time, keyed by (seed, position in the order).
  int crop_padding = 0;
  bool flip = false;
};

class FashionMnist : public Dataset {
 public:
  static constexpr int64_t kRows = 28, kCols = 28, kFeatures = kRows * kCols, kClasses = 10;

  // Reads and validates the four files. A missing file names its path and
  // the Debian package to install.
  static Result<FashionMnist> load(const FashionMnistOptions& options);

  std::string describe() const override;
  std::vector<std::string> input_names() const override { return {"x", "labels"}; }
  int64_t train_examples() const override { return train_count_; }
  int64_t eval_examples() const override { return eval_count_; }
  int64_t classes() const override { return kClasses; }

  float mean() const { return mean_; }   // what normalization subtracts (0 if off)
  float stddev() const { return std_; }  // what it divides by (1 if off)

 protected:
  Batch make_batch(int64_t rows) const override;
  void fill_train_row(Batch& b, int64_t row, uint64_t seed, int64_t pos) const override;
  void fill_eval_row(Batch& b, int64_t row, int64_t index) const override;

 private:
  // shift_r / shift_c: the crop's offset (output pixel (i, j) reads (i + shift_r,
  // j + shift_c), 0 outside); flip mirrors the columns first.
  void fill_row(Batch& b, int64_t row, const std::vector<uint8_t>& images,
                const std::vector<uint8_t>& labels, int64_t index, int shift_r = 0, int shift_c = 0,
                bool flip = false) const;

  FashionMnistOptions options_;
  std::vector<uint8_t> train_images_, train_labels_;  // the whole train file (60000)
  std::vector<uint8_t> test_images_, test_labels_;    // the test file (10000)
  int64_t train_count_ = 0;  // first train_count_ of the train file are the training split
  int64_t eval_count_ = 0;
  float mean_ = 0.f, std_ = 1.f;
};

// Reads one IDX file (gzip-compressed or not): checks the magic number
// (0x0801 labels / 0x0803 images, unsigned bytes), the dims against
// `expected_dims` (0 = any) and that the data is exactly the declared size.
Result<std::vector<uint8_t>> read_idx_gz(const std::string& path,
                                         const std::vector<int64_t>& expected_dims,
                                         std::vector<int64_t>* dims = nullptr);

}  // namespace meshflow
