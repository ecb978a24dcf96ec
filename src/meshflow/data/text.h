// Byte-level text for language models: Debian's fortunes
// (/usr/share/games/fortunes), or any list of documents. Vocabulary = the 256
// byte values.
//
//   TextOptions o;  o.seq_len = 128;
//   MF_ASSIGN_OR_RETURN(TextDataset ds, TextDataset::from_fortunes(o));
//   Batch b = value_or_throw(ds.train_batch({.seed = 0, .step = 0}, 16));
//   b.get("tokens")   // [batch, seq] i32: bytes w[0..seq)
//   b.get("targets")  // [batch, seq] i32: bytes w[1..seq], the next byte of each position
//
// Split: each document (one fortune) goes to eval with probability
// eval_fraction, decided by a hash of (split_seed, its index), so the split
// is stable across runs and machines. Each split is its documents joined,
// each followed by "%\n" (the fortune file separator), into one byte string.
// Training windows of seq_len+1 bytes start at random offsets of the train
// string (a function of (seed, stream position)); eval windows are the fixed,
// non-overlapping windows at offsets 0, seq_len, 2*seq_len, ... of the eval string.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshflow/data/dataset.h"

namespace meshflow {

struct TextOptions {
  std::string dir = "/usr/share/games/fortunes";
  int64_t seq_len = 64;
  double eval_fraction = 0.05;
  uint64_t split_seed = 0;
};

class TextDataset : public Dataset {
 public:
  static constexpr int64_t kVocab = 256;

  // Every fortune of every regular text file in options.dir (sorted by file
  // name; *.dat indexes, *.u8 links and symlinks skipped, as are files holding
  // NUL bytes). A missing or empty directory names the Debian package.
  static Result<TextDataset> from_fortunes(const TextOptions& options);
  static Result<TextDataset> from_documents(const std::vector<std::string>& docs,
                                            const TextOptions& options);

  std::string describe() const override;
  std::vector<std::string> input_names() const override { return {"tokens", "targets"}; }
  // Training window starts / eval windows.
  int64_t train_examples() const override;
  int64_t eval_examples() const override;
  int64_t classes() const override { return kVocab; }

  const std::string& train_text() const { return train_; }
  const std::string& eval_text() const { return eval_; }
  int64_t documents() const { return documents_; }

 protected:
  Batch make_batch(int64_t rows) const override;
  void fill_train_row(Batch& b, int64_t row, uint64_t seed, int64_t pos) const override;
  void fill_eval_row(Batch& b, int64_t row, int64_t index) const override;

 private:
  void fill_window(Batch& b, int64_t row, const std::string& text, int64_t start) const;

  TextOptions options_;
  std::string source_;  // where the documents came from, for describe()
  std::string train_, eval_;
  int64_t documents_ = 0, eval_documents_ = 0;
};

// Splits a fortune file's text into fortunes: separated by lines holding only
// "%"; empty fortunes dropped; each keeps its trailing newline.
std::vector<std::string> split_fortunes(const std::string& text);

}  // namespace meshflow
