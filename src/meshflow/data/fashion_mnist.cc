#include "meshflow/data/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>

#include "meshflow/core/random.h"

namespace meshflow {

namespace {

constexpr const char* kPackageHint =
    "Fashion-MNIST comes from the Debian package dataset-fashion-mnist "
    "(apt-get install dataset-fashion-mnist)";

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s;
  for (int64_t d : dims) s += (s.empty() ? "" : " x ") + std::to_string(d);
  return s.empty() ? "(scalar)" : s;
}

}  // namespace

Result<std::vector<uint8_t>> read_idx_gz(const std::string& path,
                                         const std::vector<int64_t>& expected_dims,
                                         std::vector<int64_t>* dims_out) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (!f) {
    const int err = errno;
    return Status::not_found("cannot open '" + path +
                             "': " + (err ? std::strerror(err) : "not a readable file") + "; " +
                             kPackageHint);
  }
  auto read_exact = [&](void* dst, size_t n) -> bool {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f.get(), static_cast<char*>(dst) + done, chunk);
      if (got <= 0) return false;
      done += static_cast<size_t>(got);
    }
    return true;
  };
  unsigned char header[4];
  if (!read_exact(header, 4))
    return Status::invalid("'" + path + "' is not an IDX file: shorter than its 4-byte header");
  if (header[0] != 0 || header[1] != 0 || header[2] != 0x08)
    return Status::invalid("'" + path + "' is not an unsigned-byte IDX file: magic bytes " +
                           std::to_string(header[0]) + " " + std::to_string(header[1]) + " " +
                           std::to_string(header[2]) + ", expected 0 0 8");
  const int ndims = header[3];
  if (ndims != static_cast<int>(expected_dims.size()))
    return Status::invalid("'" + path + "' has " + std::to_string(ndims) + " dims, expected " +
                           std::to_string(expected_dims.size()) + " (magic 0x08" +
                           std::to_string(expected_dims.size()) + ")");
  std::vector<int64_t> dims(ndims);
  int64_t total = 1;
  for (int i = 0; i < ndims; ++i) {
    unsigned char be[4];
    if (!read_exact(be, 4)) return Status::invalid("'" + path + "': truncated IDX header");
    dims[i] = (int64_t{be[0]} << 24) | (int64_t{be[1]} << 16) | (int64_t{be[2]} << 8) | be[3];
    if (expected_dims[i] != 0 && dims[i] != expected_dims[i])
      return Status::invalid("'" + path + "' has dims " + dims_text(dims) + "..., expected " +
                             dims_text(expected_dims) + " (0 = any)");
    total *= dims[i];
  }
  std::vector<uint8_t> data(static_cast<size_t>(total));
  if (!read_exact(data.data(), data.size()))
    return Status::invalid("'" + path + "' is truncated: the header declares " + dims_text(dims) +
                           " = " + std::to_string(total) + " bytes of data");
  char extra;
  if (gzread(f.get(), &extra, 1) > 0)
    return Status::invalid("'" + path + "' has data after the " + std::to_string(total) +
                           " bytes its header (" + dims_text(dims) + ") declares");
  if (dims_out) *dims_out = dims;
  return data;
}

Result<FashionMnist> FashionMnist::load(const FashionMnistOptions& o) {
  FashionMnist ds;
  ds.options_ = o;
  std::vector<int64_t> train_dims, train_label_dims, test_dims, test_label_dims;
  const std::string dir = o.dir.empty() || o.dir.back() == '/' ? o.dir : o.dir + "/";
  MF_ASSIGN_OR_RETURN(ds.train_images_, read_idx_gz(dir + "train-images-idx3-ubyte.gz",
                                                    {0, kRows, kCols}, &train_dims));
  MF_ASSIGN_OR_RETURN(ds.train_labels_,
                      read_idx_gz(dir + "train-labels-idx1-ubyte.gz", {0}, &train_label_dims));
  MF_ASSIGN_OR_RETURN(ds.test_images_, read_idx_gz(dir + "t10k-images-idx3-ubyte.gz",
                                                   {0, kRows, kCols}, &test_dims));
  MF_ASSIGN_OR_RETURN(ds.test_labels_,
                      read_idx_gz(dir + "t10k-labels-idx1-ubyte.gz", {0}, &test_label_dims));
  if (train_dims[0] != train_label_dims[0] || test_dims[0] != test_label_dims[0])
    return Status::invalid(
        "fashion-mnist in '" + o.dir + "': image and label counts differ (train " +
        std::to_string(train_dims[0]) + " vs " + std::to_string(train_label_dims[0]) + ", test " +
        std::to_string(test_dims[0]) + " vs " + std::to_string(test_label_dims[0]) + ")");
  for (const auto* labels : {&ds.train_labels_, &ds.test_labels_})
    for (size_t i = 0; i < labels->size(); ++i)
      if ((*labels)[i] >= kClasses)
        return Status::invalid("fashion-mnist: label " + std::to_string((*labels)[i]) +
                               " at index " + std::to_string(i) + " is not in [0, 10)");
  const int64_t n_train = train_dims[0];
  if (o.validation < 0 || o.validation >= n_train)
    return Status::invalid("data.validation must be in [0, " + std::to_string(n_train) + "), got " +
                           std::to_string(o.validation));
  if (o.eval_on_validation && o.validation == 0)
    return Status::invalid("data: eval on the validation split needs data.validation > 0");
  ds.train_count_ = n_train - o.validation;
  ds.eval_count_ = o.eval_on_validation ? o.validation : test_dims[0];
  if (o.normalize) {
    double sum = 0, sum_sq = 0;
    const int64_t n = ds.train_count_ * kFeatures;
    for (int64_t i = 0; i < n; ++i) {
      const double x = ds.train_images_[i] / 255.0;
      sum += x;
      sum_sq += x * x;
    }
    const double mean = sum / n;
    ds.mean_ = static_cast<float>(mean);
    ds.std_ = static_cast<float>(std::sqrt(std::max(sum_sq / n - mean * mean, 1e-12)));
  }
  return ds;
}

std::string FashionMnist::describe() const {
  std::string s = "fashion-mnist (" + options_.dir + "): " + std::to_string(train_count_) +
                  " train, " + std::to_string(eval_count_) +
                  (options_.eval_on_validation ? " validation" : " test") + " eval images, " +
                  std::to_string(kFeatures) + " features, " + std::to_string(kClasses) + " classes";
  if (options_.normalize)
    s += ", normalized (mean " + std::to_string(mean_) + ", std " + std::to_string(std_) + ")";
  return s;
}

Batch FashionMnist::make_batch(int64_t rows) const {
  Batch b;
  b.rows = rows;
  b.tensors.emplace_back("x", Tensor(Shape{{"batch", rows}, {"features", kFeatures}}, DType::F32));
  b.tensors.emplace_back("labels", Tensor(Shape{{"batch", rows}}, DType::I32));
  return b;
}

void FashionMnist::fill_row(Batch& b, int64_t row, const std::vector<uint8_t>& images,
                            const std::vector<uint8_t>& labels, int64_t index, int shift_r,
                            int shift_c, bool flip) const {
  float* x = b.tensors[0].second.data<float>() + row * kFeatures;
  const uint8_t* src = images.data() + index * kFeatures;
  const float scale = 1.f / (255.f * std_), shift = mean_ / std_;
  if (shift_r == 0 && shift_c == 0 && !flip) {
#pragma omp simd
    for (int64_t i = 0; i < kFeatures; ++i) x[i] = static_cast<float>(src[i]) * scale - shift;
  } else {
    for (int64_t i = 0; i < kRows; ++i)
      for (int64_t j = 0; j < kCols; ++j) {
        const int64_t r = i + shift_r, c0 = j + shift_c;
        const int64_t c = flip ? kCols - 1 - c0 : c0;
        const bool inside = r >= 0 && r < kRows && c0 >= 0 && c0 < kCols;
        x[i * kCols + j] = (inside ? static_cast<float>(src[r * kCols + c]) : 0.f) * scale - shift;
      }
  }
  b.tensors[1].second.data<int32_t>()[row] = labels[index];
}

void FashionMnist::fill_train_row(Batch& b, int64_t row, uint64_t seed, int64_t pos) const {
  const int64_t epoch = pos / train_count_;
  const uint64_t key = mix64(stream_seed("fashion-mnist.epoch", seed) ^ mix64(epoch));
  int shift_r = 0, shift_c = 0;
  bool flip = false;
  if (options_.crop_padding > 0 || options_.flip) {
    const uint64_t r = mix64(stream_seed("fashion-mnist.augment", seed) ^ mix64(uint64_t(pos)));
    const int span = 2 * options_.crop_padding + 1;
    shift_r = static_cast<int>(r % uint64_t(span)) - options_.crop_padding;
    shift_c = static_cast<int>((r >> 16) % uint64_t(span)) - options_.crop_padding;
    flip = options_.flip && ((r >> 40) & 1u);
  }
  fill_row(b, row, train_images_, train_labels_,
           shuffled_index(pos % train_count_, train_count_, key), shift_r, shift_c, flip);
}

void FashionMnist::fill_eval_row(Batch& b, int64_t row, int64_t index) const {
  if (options_.eval_on_validation)
    fill_row(b, row, train_images_, train_labels_, train_count_ + index);
  else
    fill_row(b, row, test_images_, test_labels_, index);
}

}  // namespace meshflow
