#include "meshflow/data/text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "meshflow/core/random.h"

namespace meshflow {

namespace fs = std::filesystem;

std::vector<std::string> split_fortunes(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (cur.find_first_not_of(" \t\r\n") != std::string::npos) out.push_back(cur);
    cur.clear();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    const size_t next = end == std::string::npos ? text.size() : end + 1;
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == "%")
      flush();
    else
      cur.append(text, pos, next - pos);
    pos = next;
  }
  flush();
  return out;
}

Result<TextDataset> TextDataset::from_fortunes(const TextOptions& options) {
  const std::string hint =
      "fortunes come from the Debian package 'fortunes' (apt-get install fortunes)";
  std::error_code ec;
  if (!fs::is_directory(options.dir, ec))
    return Status::not_found("no fortune directory '" + options.dir + "'; " + hint);
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(options.dir, ec)) {
    const fs::path& p = e.path();
    const std::string ext = p.extension().string();
    if (ext == ".dat" || ext == ".u8") continue;  // strfile indexes and UTF-8 duplicate links
    if (e.is_symlink(ec) || !e.is_regular_file(ec)) continue;
    files.push_back(p);
  }
  if (ec) return Status::not_found("cannot list '" + options.dir + "': " + ec.message());
  std::sort(files.begin(), files.end());
  std::vector<std::string> docs;
  for (const fs::path& p : files) {
    std::ifstream in(p, std::ios::binary);
    if (!in) continue;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    if (text.find('\0') != std::string::npos) continue;  // not text
    for (std::string& f : split_fortunes(text)) docs.push_back(std::move(f));
  }
  if (docs.empty()) return Status::not_found("no fortunes found in '" + options.dir + "'; " + hint);
  MF_ASSIGN_OR_RETURN(TextDataset ds, from_documents(docs, options));
  ds.source_ = options.dir + " (" + std::to_string(files.size()) + " files)";
  return ds;
}

Result<TextDataset> TextDataset::from_documents(const std::vector<std::string>& docs,
                                                const TextOptions& o) {
  if (o.seq_len < 1)
    return Status::invalid("data: seq_len must be >= 1, got " + std::to_string(o.seq_len));
  if (!(o.eval_fraction >= 0.0 && o.eval_fraction < 1.0))
    return Status::invalid("data.eval_fraction must be in [0, 1), got " +
                           std::to_string(o.eval_fraction));
  TextDataset ds;
  ds.options_ = o;
  ds.source_ = std::to_string(docs.size()) + " documents";
  ds.documents_ = static_cast<int64_t>(docs.size());
  const uint64_t stream = stream_seed("text.split", o.split_seed);
  for (size_t i = 0; i < docs.size(); ++i) {
    const bool eval = uniform01(stream, i) < o.eval_fraction;
    std::string& dst = eval ? ds.eval_ : ds.train_;
    dst += docs[i];
    if (!docs[i].empty() && docs[i].back() != '\n') dst += '\n';
    dst += "%\n";
    ds.eval_documents_ += eval;
  }
  if (static_cast<int64_t>(ds.train_.size()) < o.seq_len + 1)
    return Status::invalid(
        "data: the training text has " + std::to_string(ds.train_.size()) +
        " bytes, fewer than one window of seq_len + 1 = " + std::to_string(o.seq_len + 1));
  return ds;
}

int64_t TextDataset::train_examples() const {
  return static_cast<int64_t>(train_.size()) - options_.seq_len;
}

int64_t TextDataset::eval_examples() const {
  const int64_t n = static_cast<int64_t>(eval_.size());
  return n < options_.seq_len + 1 ? 0 : (n - 1) / options_.seq_len;
}

std::string TextDataset::describe() const {
  return "text from " + source_ + ": " + std::to_string(documents_ - eval_documents_) +
         " train documents (" + std::to_string(train_.size()) + " bytes), " +
         std::to_string(eval_documents_) + " eval documents (" + std::to_string(eval_.size()) +
         " bytes, " + std::to_string(eval_examples()) + " windows), seq " +
         std::to_string(options_.seq_len) + ", vocab 256 (bytes)";
}

Batch TextDataset::make_batch(int64_t rows) const {
  Batch b;
  b.rows = rows;
  const Shape s{{"batch", rows}, {"seq", options_.seq_len}};
  b.tensors.emplace_back("tokens", Tensor(s, DType::I32));
  b.tensors.emplace_back("targets", Tensor(s, DType::I32));
  return b;
}

void TextDataset::fill_window(Batch& b, int64_t row, const std::string& text, int64_t start) const {
  const int64_t T = options_.seq_len;
  int32_t* tokens = b.tensors[0].second.data<int32_t>() + row * T;
  int32_t* targets = b.tensors[1].second.data<int32_t>() + row * T;
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data()) + start;
  for (int64_t t = 0; t < T; ++t) {
    tokens[t] = bytes[t];
    targets[t] = bytes[t + 1];
  }
}

void TextDataset::fill_train_row(Batch& b, int64_t row, uint64_t seed, int64_t pos) const {
  const uint64_t stream = stream_seed("text.window", seed);
  const int64_t start = static_cast<int64_t>(random_bits(stream, pos) % train_examples());
  fill_window(b, row, train_, start);
}

void TextDataset::fill_eval_row(Batch& b, int64_t row, int64_t index) const {
  fill_window(b, row, eval_, index * options_.seq_len);
}

}  // namespace meshflow
