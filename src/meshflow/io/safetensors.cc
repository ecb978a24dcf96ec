#include "meshflow/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "meshflow/core/file_io.h"

namespace meshflow {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps here");

namespace {

using json = nlohmann::json;

// Same limit as the reference implementation: a larger header is not a real file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Every dtype of the format, with its element size: unknown names and known but
// unsupported ones get different messages.
struct FileDType {
  const char* name;
  size_t size;
  bool supported;
};
constexpr FileDType kFileDTypes[] = {
    {"F32", 4, true},   {"I32", 4, true},      {"BF16", 2, true},     {"F16", 2, true},
    {"F64", 8, false},  {"I64", 8, false},     {"U64", 8, false},     {"U32", 4, false},
    {"I16", 2, false},  {"U16", 2, false},     {"I8", 1, false},      {"U8", 1, false},
    {"BOOL", 1, false}, {"F8_E4M3", 1, false}, {"F8_E5M2", 1, false},
};

const FileDType* find_file_dtype(const std::string& name) {
  for (const FileDType& d : kFileDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string sizes_string(const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? "," : "") + std::to_string(sizes[i]);
  return s + "]";
}

std::string range_string(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// One tensor's header entry, validated against the data size.
struct Entry {
  std::string name;
  const FileDType* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

Status file_error(const std::string& path, const std::string& what) {
  return Status::invalid("safetensors '" + path + "': " + what);
}

// Parses the JSON header, rejecting duplicate tensor names (the JSON parser
// would silently keep the last one).
Result<json> parse_header_json(const std::string& path, const std::string& text) {
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!seen.insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  json h;
  try {
    h = json::parse(text, cb);
  } catch (const json::exception& e) {
    return file_error(path, "header is not valid JSON: " + std::string(e.what()));
  }
  if (!duplicate.empty()) return file_error(path, "header names tensor '" + duplicate + "' twice");
  if (!h.is_object()) return file_error(path, "header must be a JSON object, got " + h.dump());
  return h;
}

Result<Entry> parse_entry(const std::string& path, const std::string& name, const json& e,
                          uint64_t data_bytes) {
  auto bad = [&](const std::string& what) {
    return file_error(path, "tensor '" + name + "': " + what);
  };
  if (!e.is_object()) return bad("entry must be an object with dtype, shape, data_offsets");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!e.contains(field)) return bad(std::string("entry has no \"") + field + "\"");
  for (auto it = e.begin(); it != e.end(); ++it)
    if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
      return bad("unexpected field \"" + it.key() + "\"");

  Entry out;
  out.name = name;
  if (!e["dtype"].is_string()) return bad("dtype must be a string, got " + e["dtype"].dump());
  const std::string dt = e["dtype"].get<std::string>();
  out.dtype = find_file_dtype(dt);
  if (!out.dtype)
    return bad("unknown dtype '" + dt + "' (supported: " + safetensors_supported_dtypes() + ")");
  if (!out.dtype->supported)
    return bad("dtype " + dt + " is not supported (supported: " + safetensors_supported_dtypes() +
               ")");

  const json& shape = e["shape"];
  if (!shape.is_array()) return bad("shape must be an array, got " + shape.dump());
  uint64_t numel = 1;
  for (const json& d : shape) {
    if (!d.is_number_unsigned()) return bad("shape " + shape.dump() + " has a non-integer dim");
    const uint64_t s = d.get<uint64_t>();
    if (s == 0) return bad("shape " + shape.dump() + " has a dim of size 0 (meshflow needs >= 1)");
    if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / numel)
      return bad("shape " + shape.dump() + " is too large");
    numel *= s;
    out.shape.push_back(static_cast<int64_t>(s));
  }

  const json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned())
    return bad("data_offsets must be [begin, end] with integers >= 0, got " + off.dump());
  out.begin = off[0].get<uint64_t>();
  out.end = off[1].get<uint64_t>();
  if (out.begin > out.end)
    return bad("data_offsets " + range_string(out.begin, out.end) + " end before they begin");
  if (out.end > data_bytes)
    return bad("data_offsets " + range_string(out.begin, out.end) +
               " run past the end of the data section (" + std::to_string(data_bytes) +
               " bytes); the file is truncated or the offsets are wrong");
  const uint64_t want = numel * out.dtype->size;
  if (numel > std::numeric_limits<uint64_t>::max() / out.dtype->size || out.end - out.begin != want)
    return bad(dt + sizes_string(out.shape) + " needs " + std::to_string(want) +
               " bytes but data_offsets " + range_string(out.begin, out.end) + " span " +
               std::to_string(out.end - out.begin));
  return out;
}

Result<Header> parse_header(const std::string& path, const std::string& text, uint64_t data_bytes) {
  MF_ASSIGN_OR_RETURN(json h, parse_header_json(path, text));
  Header out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        return file_error(path, "__metadata__ must be an object of strings, got " + it->dump());
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return file_error(
              path, "__metadata__ value of '" + m.key() + "' must be a string, got " + m->dump());
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    MF_ASSIGN_OR_RETURN(Entry e, parse_entry(path, it.key(), *it, data_bytes));
    out.entries.push_back(std::move(e));
  }
  // No two tensors may share bytes.
  std::vector<const Entry*> by_begin;
  for (const Entry& e : out.entries) by_begin.push_back(&e);
  std::sort(by_begin.begin(), by_begin.end(),
            [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    const Entry& a = *by_begin[i - 1];
    const Entry& b = *by_begin[i];
    if (b.begin < a.end)
      return file_error(path, "tensors '" + a.name + "' " + range_string(a.begin, a.end) +
                                  " and '" + b.name + "' " + range_string(b.begin, b.end) +
                                  " overlap");
  }
  return out;
}

// bf16 / f16 -> f32: core/dtype.h.

// Closes a FILE* on scope exit.
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

bool read_at(std::FILE* f, uint64_t offset, void* dst, size_t n) {
  if (fseeko(f, static_cast<off_t>(offset), SEEK_SET) != 0) return false;
  return std::fread(dst, 1, n, f) == n;
}

Status errno_error(const std::string& what, const std::string& path) {
  return Status::unavailable(what + " '" + path + "': " + std::strerror(errno));
}

// Writes all of [p, p + n) to fd, retrying short writes.
bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The rename of an atomic write replaces a device node, FIFO or socket at
// the target (as root, `--checkpoint /dev/full` would delete the device), so
// those are refused. Directories are not: rename fails on them by itself.
Status refuse_special_file(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))
    return Status::ok();
  return Status::invalid("writing safetensors '" + path + "': not a regular file (it is " +
                         file_kind_name(st.st_mode) + "); give the path of a file");
}

}  // namespace

std::string safetensors_supported_dtypes() {
  std::string s;
  for (const FileDType& d : kFileDTypes)
    if (d.supported) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

uint32_t crc32_of(const void* data, size_t n, uint32_t crc) {
  // zlib takes uInt lengths: feed it in pieces below 4 GiB.
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {
    const size_t piece = std::min<size_t>(n, 1u << 30);
    c = ::crc32(c, p, static_cast<uInt>(piece));
    p += piece, n -= piece;
  }
  return static_cast<uint32_t>(c);
}

Status write_safetensors(const std::string& path, const NamedTensors& tensors,
                         const std::map<std::string, std::string>& metadata,
                         SafetensorsWritten* written) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    auto bad = [&](const std::string& what) {
      return Status::invalid("writing safetensors '" + path + "': tensor '" + name + "' " + what);
    };
    if (name.empty())
      return Status::invalid("writing safetensors '" + path + "': empty tensor name");
    if (name == "__metadata__") return bad("uses the reserved name");
    if (header.contains(name)) return bad("appears twice");
    if (!t.defined()) return bad("has no data");
    if (t.dtype() != DType::F32 && t.dtype() != DType::I32)
      return bad("is " + std::string(dtype_name(t.dtype())) + "; only f32 and i32 are written");
    json shape = json::array();
    for (int64_t s : t.shape().sizes()) shape.push_back(s);
    header[name] = {{"dtype", t.dtype() == DType::F32 ? "F32" : "I32"},
                    {"shape", std::move(shape)},
                    {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as HF does
  uint64_t n = text.size();

  MF_RETURN_IF_ERROR(refuse_special_file(path));
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error("writing safetensors: cannot create", tmp);
  auto fail = [&](const std::string& what) {
    Status s = errno_error("writing safetensors: " + what, tmp);
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  char len[8];
  std::memcpy(len, &n, 8);
  if (!write_all(fd, len, 8) || !write_all(fd, text.data(), text.size()))
    return fail("cannot write header to");
  SafetensorsWritten info;
  info.crc32 = crc32_of(text.data(), text.size(), crc32_of(len, 8));
  info.bytes = 8 + n;
  for (const auto& [name, t] : tensors) {
    if (!write_all(fd, static_cast<const char*>(t.raw()), t.nbytes()))
      return fail("cannot write tensor '" + name + "' to");
    info.offsets.push_back(info.bytes);
    info.bytes += t.nbytes();
    const uint32_t crc = crc32_of(t.raw(), t.nbytes());
    info.tensor_crc32.push_back(crc);
    info.crc32 =
        static_cast<uint32_t>(::crc32_combine(info.crc32, crc, static_cast<z_off_t>(t.nbytes())));
  }
  if (::fsync(fd) != 0) return fail("fsync failed on");
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) return fail("close failed on");
  if (Status s = refuse_special_file(path); !s.is_ok()) {  // it may have changed meanwhile
    ::unlink(tmp.c_str());
    return s;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::unavailable("writing safetensors: cannot rename '" + tmp + "' to '" + path +
                                   "': " + std::strerror(errno));
    ::unlink(tmp.c_str());
    return s;
  }
  // Make the rename itself durable (best effort: some filesystems refuse).
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  if (written) *written = std::move(info);
  return Status::ok();
}

Status check_finite_weights(const SafetensorsFile& file, const std::string& path) {
  for (const auto& [name, t] : file.tensors) {
    if (t.dtype() != DType::F32) continue;
    const float* x = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i)
      if (!std::isfinite(x[i]))
        return Status::invalid("checkpoint '" + path + "': tensor '" + name +
                               "' holds a non-finite value (" + std::to_string(x[i]) +
                               " at element " + std::to_string(i) +
                               "); the file is corrupt or was written by a diverged run");
  }
  return Status::ok();
}

Result<SafetensorsFile> read_safetensors(const std::string& path) {
  std::error_code ec;
  auto st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st))
    return Status::not_found("safetensors '" + path + "': no such file");
  if (std::filesystem::is_directory(st)) return file_error(path, "is a directory, not a file");
  // A device never ends and a FIFO blocks: only regular files are read.
  if (!std::filesystem::is_regular_file(st))
    return file_error(path, "is not a regular file; give the path of a .safetensors file");
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) return errno_error("safetensors: cannot open", path);
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) return file_error(path, "cannot get its size: " + ec.message());

  if (file_bytes < 8)
    return file_error(path, "file is " + std::to_string(file_bytes) +
                                " bytes, too short for the 8-byte header length (truncated?)");
  uint64_t n = 0;
  if (!read_at(f.get(), 0, &n, 8)) return file_error(path, "cannot read the header length");
  if (n > kMaxHeaderBytes)
    return file_error(path, "header length " + std::to_string(n) + " exceeds the " +
                                std::to_string(kMaxHeaderBytes) +
                                "-byte limit (not a safetensors file?)");
  if (n > file_bytes - 8)
    return file_error(path, "header length " + std::to_string(n) +
                                " runs past the end of the file (" + std::to_string(file_bytes) +
                                " bytes): truncated header");
  std::string text(n, '\0');
  if (n > 0 && !read_at(f.get(), 8, text.data(), n))
    return file_error(path, "cannot read the " + std::to_string(n) + "-byte header");
  const uint64_t data_start = 8 + n;
  MF_ASSIGN_OR_RETURN(Header h, parse_header(path, text, file_bytes - data_start));

  SafetensorsFile out;
  out.metadata = std::move(h.metadata);
  std::vector<uint16_t> half;
  for (const Entry& e : h.entries) {
    std::vector<Dim> dims;
    for (int64_t s : e.shape) dims.push_back({"", s});
    const std::string dt = e.dtype->name;
    const bool is_int = dt == "I32";
    Tensor t(Shape(std::move(dims)), is_int ? DType::I32 : DType::F32);
    const size_t bytes = e.end - e.begin;
    bool ok;
    if (dt == "F32" || dt == "I32") {
      ok = read_at(f.get(), data_start + e.begin, t.raw(), bytes);
    } else {
      half.resize(static_cast<size_t>(t.numel()));
      ok = read_at(f.get(), data_start + e.begin, half.data(), bytes);
      float* dst = t.data<float>();
      const bool bf = dt == "BF16";
      for (size_t i = 0; i < half.size(); ++i)
        dst[i] = bf ? bf16_to_f32(half[i]) : f16_to_f32(half[i]);
    }
    if (!ok) return file_error(path, "cannot read the data of tensor '" + e.name + "'");
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

namespace {

std::vector<ValueId> checkpoint_values(const Graph& g, CheckpointOptions options) {
  std::vector<ValueId> vs = g.model_values();
  if (options.optimizer_state) {
    const std::vector<ValueId> buffers = g.buffers();
    for (ValueId v : g.states())
      if (std::find(buffers.begin(), buffers.end(), v) == buffers.end()) vs.push_back(v);
  }
  return vs;
}

// "'a'" or "'a' (and 3 more: 'b', 'c', 'd')".
std::string name_list(const std::vector<std::string>& names) {
  std::string s = "'" + names[0] + "'";
  if (names.size() == 1) return s;
  s += " (and " + std::to_string(names.size() - 1) + " more: ";
  for (size_t i = 1; i < names.size() && i <= 5; ++i) s += (i > 1 ? ", '" : "'") + names[i] + "'";
  if (names.size() > 6) s += ", ...";
  return s + ")";
}

}  // namespace

Status save_parameters(ParameterStore& ex, const std::string& path,
                       const std::map<std::string, std::string>& metadata,
                       CheckpointOptions options) {
  const Graph& g = ex.graph();
  NamedTensors tensors;
  for (ValueId v : checkpoint_values(g, options))
    tensors.emplace_back(g.value(v).name, ex.storage(v));
  return write_safetensors(path, tensors, metadata);
}

Result<std::map<std::string, std::string>> load_parameters(ParameterStore& ex,
                                                           const std::string& path,
                                                           CheckpointOptions options) {
  MF_ASSIGN_OR_RETURN(SafetensorsFile file, read_safetensors(path));
  MF_RETURN_IF_ERROR(check_finite_weights(file, path));
  const Graph& g = ex.graph();
  const std::string where = "checkpoint '" + path + "': ";
  const std::vector<ValueId> wanted = checkpoint_values(g, options);

  // Validate everything first, so a bad file changes nothing.
  std::set<std::string> model_names;
  std::vector<std::string> missing;
  std::string missing_kind;
  for (ValueId v : wanted) {
    const Value& val = g.value(v);
    const std::string kind = g.producer(v).kind == OpKind::kState ? "optimizer state" : "parameter";
    model_names.insert(val.name);
    auto it = file.tensors.find(val.name);
    if (it == file.tensors.end()) {
      if (missing.empty()) missing_kind = kind;
      missing.push_back(val.name);
      continue;
    }
    const Tensor& t = it->second;
    if (!t.shape().same_sizes(val.shape))
      return Status::invalid(where + kind + " '" + val.name + "' has shape " +
                             sizes_string(t.shape().sizes()) + " in the file but " +
                             sizes_string(val.shape.sizes()) + " in the model " +
                             val.shape.to_string());
    if (t.dtype() != val.dtype)
      return Status::invalid(where + kind + " '" + val.name + "' is " +
                             std::string(dtype_name(t.dtype())) + " in the file but " +
                             std::string(dtype_name(val.dtype)) + " in the model");
  }
  if (!missing.empty())
    return Status::not_found(where + missing_kind + " " + name_list(missing) +
                             " is missing from the file");
  std::vector<std::string> extra;
  bool extra_state = false;
  for (const auto& [name, t] : file.tensors) {
    if (model_names.count(name)) continue;
    extra.push_back(name);
    ValueId v = g.find(name);
    if (v != kNoValue && g.producer(v).kind == OpKind::kState) extra_state = true;
  }
  if (!extra.empty())
    return Status::invalid(where + "tensor " + name_list(extra) +
                           " in the file matches no parameter of the model" +
                           (extra_state ? " (the file holds optimizer state: load it with "
                                          "CheckpointOptions{.optimizer_state = true})"
                                        : ""));

  for (ValueId v : wanted) {
    Tensor& dst = ex.storage(v);
    dst.copy_from(file.tensors.at(g.value(v).name).raw());
  }
  return file.metadata;
}

}  // namespace meshflow
