#include "meshflow/io/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "meshflow/core/check.h"
#include "meshflow/core/file_io.h"
#include "meshflow/io/safetensors.h"

namespace meshflow {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "meshflow-checkpoint";
constexpr int kVersion = 1;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string staging_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / ("." + step_name(step) + ".partial")).string();
}

std::string rank_file(int rank, const char* ext) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank-%05d.%s", rank, ext);
  return buf;
}

// The step of a "step-NNNNNNNN" directory name, or -1.
int64_t parse_step_name(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "step-") != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || step > (int64_t{1} << 50)) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::string fs_error(const std::string& what, const std::string& path, const std::error_code& ec) {
  return what + " '" + path + "': " + ec.message();
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

int64_t volume(const IndexRanges& r) {
  int64_t v = 1;
  for (const auto& [lo, hi] : r) v *= hi - lo;
  return v;
}

std::string ranges_string(const IndexRanges& r) {
  std::string s = "[";
  for (size_t i = 0; i < r.size(); ++i)
    s += (i ? ", " : "") + std::to_string(r[i].first) + ":" + std::to_string(r[i].second);
  return s + "]";
}

json ranges_json(const IndexRanges& r) {
  json a = json::array();
  for (const auto& [lo, hi] : r) a.push_back({lo, hi});
  return a;
}

std::string dtype_text(DType t) {
  return t == DType::I32 ? "I32" : "F32";
}

// Copies the overlap of block `src` (box `sr`) into block `dst` (box `dr`),
// 4-byte elements, row-major; returns the elements copied.
int64_t copy_overlap(const char* src, const IndexRanges& sr, char* dst, const IndexRanges& dr) {
  const size_t n = sr.size();
  IndexRanges o(n);
  for (size_t d = 0; d < n; ++d) {
    o[d] = {std::max(sr[d].first, dr[d].first), std::min(sr[d].second, dr[d].second)};
    if (o[d].first >= o[d].second) return 0;
  }
  if (n == 0) {
    std::memcpy(dst, src, 4);
    return 1;
  }
  // Strides (in elements) of both boxes.
  std::vector<int64_t> ss(n, 1), ds(n, 1);
  for (size_t d = n - 1; d > 0; --d) {
    ss[d - 1] = ss[d] * (sr[d].second - sr[d].first);
    ds[d - 1] = ds[d] * (dr[d].second - dr[d].first);
  }
  const int64_t run = o[n - 1].second - o[n - 1].first;
  std::vector<int64_t> idx(n);
  for (size_t d = 0; d < n; ++d) idx[d] = o[d].first;
  int64_t copied = 0;
  while (true) {
    int64_t so = 0, dof = 0;
    for (size_t d = 0; d < n; ++d) {
      so += (idx[d] - sr[d].first) * ss[d];
      dof += (idx[d] - dr[d].first) * ds[d];
    }
    std::memcpy(dst + 4 * dof, src + 4 * so, static_cast<size_t>(4 * run));
    copied += run;
    // Next index over all dims but the last.
    size_t d = n - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < o[d].second) break;
      idx[d] = o[d].first;
      if (d == 0) return copied;
    }
    if (n == 1) return copied;
  }
}

bool overlaps(const IndexRanges& a, const IndexRanges& b) {
  for (size_t d = 0; d < a.size(); ++d)
    if (std::max(a[d].first, b[d].first) >= std::min(a[d].second, b[d].second)) return false;
  return true;
}

// ---- manifest parsing: every field checked, never an exception escaping ----

struct ParseError {
  std::string what;
};

const json& field(const json& o, const char* key, const std::string& where) {
  if (!o.is_object() || !o.contains(key))
    throw ParseError{where + " has no \"" + std::string(key) + "\""};
  return o.at(key);
}

int64_t integer(const json& v, const std::string& where, int64_t lo = 0) {
  if (!v.is_number_integer() || v.get<int64_t>() < lo)
    throw ParseError{where + " must be an integer >= " + std::to_string(lo) + ", got " + v.dump()};
  return v.get<int64_t>();
}

uint64_t unsigned_integer(const json& v, const std::string& where) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    throw ParseError{where + " must be an integer >= 0, got " + v.dump()};
  return v.get<uint64_t>();
}

const std::string& text(const json& v, const std::string& where) {
  if (!v.is_string()) throw ParseError{where + " must be a string, got " + v.dump()};
  return v.get_ref<const std::string&>();
}

IndexRanges parse_ranges(const json& v, const Shape& shape, const std::string& where) {
  if (!v.is_array() || static_cast<int>(v.size()) != shape.rank())
    throw ParseError{where + " must list " + std::to_string(shape.rank()) +
                     " [begin, end) ranges, got " + v.dump()};
  IndexRanges r;
  for (int d = 0; d < shape.rank(); ++d) {
    const json& p = v[static_cast<size_t>(d)];
    if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number_integer())
      throw ParseError{where + ": range " + p.dump() + " is not [begin, end]"};
    const int64_t lo = p[0].get<int64_t>(), hi = p[1].get<int64_t>();
    if (lo < 0 || lo >= hi || hi > shape.size(d))
      throw ParseError{where + ": range " + p.dump() + " is not inside dim " + std::to_string(d) +
                       " of size " + std::to_string(shape.size(d))};
    r.push_back({lo, hi});
  }
  return r;
}

CheckpointManifest parse_manifest(const json& j, const std::string& dir) {
  CheckpointManifest m;
  m.dir = dir;
  const std::string w = "manifest";
  if (!j.is_object()) throw ParseError{"the manifest is not a JSON object"};
  if (!j.contains("format") || j["format"] != kFormat)
    throw ParseError{"\"format\" is not \"" + std::string(kFormat) + "\""};
  const int64_t version = integer(field(j, "version", w), "\"version\"");
  if (version != kVersion)
    throw ParseError{"version " + std::to_string(version) + " (this build reads version " +
                     std::to_string(kVersion) + ")"};
  m.step = integer(field(j, "step", w), "\"step\"");
  if (j.contains("info")) m.info = j["info"];
  const json& files = field(j, "files", w);
  if (!files.is_object()) throw ParseError{"\"files\" must be an object"};
  for (const auto& [name, f] : files.items()) {
    if (name.empty() || name.find('/') != std::string::npos || name[0] == '.')
      throw ParseError{"file name '" + name + "' is not a plain name in the directory"};
    const std::string fw = "files." + name;
    m.files[name] = {unsigned_integer(field(f, "bytes", fw), fw + ".bytes"),
                     static_cast<uint32_t>(unsigned_integer(field(f, "crc32", fw), fw + ".crc32"))};
  }
  const json& tensors = field(j, "tensors", w);
  if (!tensors.is_object()) throw ParseError{"\"tensors\" must be an object"};
  for (const auto& [name, t] : tensors.items()) {
    const std::string tw = "tensor '" + name + "'";
    CheckpointTensor ct;
    ct.kind = text(field(t, "kind", tw), tw + ".kind");
    const std::string& dt = text(field(t, "dtype", tw), tw + ".dtype");
    if (dt != "F32" && dt != "I32") throw ParseError{tw + ": dtype " + dt + " (F32 or I32)"};
    ct.dtype = dt == "I32" ? DType::I32 : DType::F32;
    const json& shape = field(t, "shape", tw);
    const json& dims = field(t, "dims", tw);
    if (!shape.is_array() || !dims.is_array() || shape.size() != dims.size() || shape.size() > 8)
      throw ParseError{tw + ": \"shape\" and \"dims\" must be arrays of one length (at most 8)"};
    std::vector<Dim> ds;
    for (size_t d = 0; d < shape.size(); ++d)
      ds.push_back({text(dims[d], tw + ".dims"), integer(shape[d], tw + ".shape", 1)});
    ct.global = Shape(ds);
    const json& blocks = field(t, "blocks", tw);
    if (!blocks.is_array() || blocks.empty())
      throw ParseError{tw + ": \"blocks\" must be a non-empty array"};
    for (const json& b : blocks) {
      CheckpointTensor::Block blk;
      blk.file = text(field(b, "file", tw), tw + ".file");
      if (!m.files.count(blk.file))
        throw ParseError{tw + ": block in file '" + blk.file + "', which \"files\" does not list"};
      blk.offset = unsigned_integer(field(b, "offset", tw), tw + ".offset");
      blk.ranges = parse_ranges(field(b, "ranges", tw), ct.global, tw);
      blk.crc32 = static_cast<uint32_t>(unsigned_integer(field(b, "crc32", tw), tw + ".crc32"));
      const uint64_t end = blk.offset + static_cast<uint64_t>(volume(blk.ranges)) * 4;
      if (end > m.files[blk.file].first)
        throw ParseError{tw + ": block " + ranges_string(blk.ranges) + " ends at byte " +
                         std::to_string(end) + " of '" + blk.file + "', which has " +
                         std::to_string(m.files[blk.file].first)};
      ct.blocks.push_back(std::move(blk));
    }
    m.tensors.emplace(name, std::move(ct));
  }
  return m;
}

Result<CheckpointManifest> read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / "manifest.json").string();
  Result<std::string> body = read_regular_file(path);
  if (!body.is_ok()) return body.status();
  json j;
  try {
    j = json::parse(*body);
  } catch (const std::exception& e) {
    return Status::invalid("checkpoint '" + dir + "': manifest.json is not valid JSON (" +
                           e.what() + ")");
  }
  try {
    return parse_manifest(j, dir);
  } catch (const ParseError& e) {
    return Status::invalid("checkpoint '" + dir + "': manifest.json: " + e.what);
  } catch (const std::exception& e) {
    return Status::invalid("checkpoint '" + dir + "': manifest.json: " + e.what());
  }
}

}  // namespace

std::string checkpoint_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / step_name(step)).string();
}

std::vector<std::string> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const int64_t step = parse_step_name(name);
    if (step < 0 || !fs::exists(it->path() / "manifest.json", ec)) continue;
    found.push_back({step, it->path().string()});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

Status prepare_checkpoint(const std::string& root, int64_t step) {
  std::error_code ec;
  if (fs::exists(root, ec) && !fs::is_directory(root, ec))
    return Status::invalid("checkpoint directory '" + root +
                           "' is a file; give a directory (a path ending in .safetensors writes "
                           "the weights alone)");
  fs::create_directories(root, ec);
  if (ec) return Status::unavailable(fs_error("cannot create checkpoint directory", root, ec));
  const std::string stage = staging_dir(root, step);
  fs::remove_all(stage, ec);  // a crashed save's leftovers
  if (ec) return Status::unavailable(fs_error("cannot remove stale", stage, ec));
  fs::create_directory(stage, ec);
  if (ec) return Status::unavailable(fs_error("cannot create", stage, ec));
  return Status::ok();
}

Status write_checkpoint_shard(const std::string& root, int64_t step, int rank,
                              const std::vector<CheckpointBlock>& blocks) {
  const std::string stage = staging_dir(root, step);
  NamedTensors named;
  std::set<std::string> seen;
  for (const CheckpointBlock& b : blocks) {
    if (!b.data || !seen.insert(b.name).second)
      return Status::internal("checkpoint shard of rank " + std::to_string(rank) + ": block '" +
                              b.name + "' missing or given twice");
    if (static_cast<int>(b.ranges.size()) != b.global.rank() || volume(b.ranges) != b.data->numel())
      return Status::internal("checkpoint shard: block '" + b.name + "' " +
                              ranges_string(b.ranges) + " does not match its data " +
                              b.data->shape().to_string());
    named.emplace_back(b.name, *b.data);
  }
  const std::string file = rank_file(rank, "safetensors");
  SafetensorsWritten written;
  MF_RETURN_IF_ERROR(write_safetensors((fs::path(stage) / file).string(), named,
                                       {{"format", "meshflow-checkpoint-shard"},
                                        {"step", std::to_string(step)},
                                        {"rank", std::to_string(rank)}},
                                       &written));
  json frag = {{"rank", rank},
               {"file", file},
               {"bytes", written.bytes},
               {"crc32", written.crc32},
               {"blocks", json::array()}};
  for (size_t i = 0; i < blocks.size(); ++i) {
    const CheckpointBlock& b = blocks[i];
    json shape = json::array(), dims = json::array();
    for (const Dim& d : b.global.dims()) shape.push_back(d.size), dims.push_back(d.name);
    frag["blocks"].push_back({{"name", b.name},
                              {"kind", b.kind},
                              {"dtype", dtype_text(b.data->dtype())},
                              {"shape", shape},
                              {"dims", dims},
                              {"ranges", ranges_json(b.ranges)},
                              {"offset", written.offsets[i]},
                              {"crc32", written.tensor_crc32[i]}});
  }
  return write_file_atomic((fs::path(stage) / rank_file(rank, "json")).string(), frag.dump(),
                           "checkpoint fragment");
}

Status commit_checkpoint(const std::string& root, int64_t step, int world, const json& info,
                         int keep) {
  const std::string stage = staging_dir(root, step);
  json tensors = json::object(), files = json::object();
  std::map<std::string, std::vector<IndexRanges>> tiles;
  for (int r = 0; r < world; ++r) {
    const std::string path = (fs::path(stage) / rank_file(r, "json")).string();
    Result<std::string> body = read_regular_file(path);
    if (!body.is_ok())
      return Status::unavailable("checkpoint of step " + std::to_string(step) + ": rank " +
                                 std::to_string(r) + "'s shard is missing (" +
                                 body.status().message() + ")");
    const json f = json::parse(*body, nullptr, false);
    if (f.is_discarded() || !f.contains("blocks"))
      return Status::internal("checkpoint fragment '" + path + "' is not valid");
    files[f["file"].get<std::string>()] = {{"bytes", f["bytes"]}, {"crc32", f["crc32"]}};
    for (const json& b : f["blocks"]) {
      const std::string name = b["name"];
      json& t = tensors[name];
      if (t.is_null()) {
        t = {{"kind", b["kind"]},
             {"dtype", b["dtype"]},
             {"shape", b["shape"]},
             {"dims", b["dims"]},
             {"blocks", json::array()}};
      } else if (t["shape"] != b["shape"] || t["dtype"] != b["dtype"] || t["kind"] != b["kind"]) {
        return Status::internal("checkpoint: ranks disagree on tensor '" + name + "' (" +
                                t["shape"].dump() + " vs " + b["shape"].dump() + ")");
      }
      t["blocks"].push_back({{"file", f["file"]},
                             {"offset", b["offset"]},
                             {"ranges", b["ranges"]},
                             {"crc32", b["crc32"]}});
      IndexRanges rg;
      for (const json& p : b["ranges"]) rg.push_back({p[0].get<int64_t>(), p[1].get<int64_t>()});
      tiles[name].push_back(std::move(rg));
    }
  }
  // The blocks of each tensor tile it: disjoint, and together its volume.
  for (const auto& [name, blocks] : tiles) {
    int64_t total = 1, covered = 0;
    for (const json& s : tensors[name]["shape"]) total *= s.get<int64_t>();
    for (size_t i = 0; i < blocks.size(); ++i) {
      covered += volume(blocks[i]);
      for (size_t k = 0; k < i; ++k)
        if (overlaps(blocks[i], blocks[k]))
          return Status::internal("checkpoint: tensor '" + name + "' has overlapping blocks " +
                                  ranges_string(blocks[k]) + " and " + ranges_string(blocks[i]));
    }
    if (covered != total)
      return Status::internal("checkpoint: the blocks of tensor '" + name + "' cover " +
                              std::to_string(covered) + " of its " + std::to_string(total) +
                              " elements");
  }
  const json manifest = {{"format", kFormat}, {"version", kVersion}, {"step", step},
                         {"info", info},      {"files", files},      {"tensors", tensors}};
  MF_RETURN_IF_ERROR(write_file_atomic((fs::path(stage) / "manifest.json").string(),
                                       manifest.dump(1), "checkpoint manifest"));
  const std::string final_dir = checkpoint_dir(root, step);
  std::error_code ec;
  if (fs::exists(final_dir, ec)) {  // a re-save of the same step: the old one goes aside first
    const std::string old = final_dir + ".replaced";
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) return Status::unavailable(fs_error("cannot move aside", final_dir, ec));
    fs::rename(stage, final_dir, ec);
    if (ec)
      return Status::unavailable(fs_error("cannot rename the staged checkpoint to", final_dir, ec));
    fs::remove_all(old, ec);
  } else {
    fs::rename(stage, final_dir, ec);
    if (ec)
      return Status::unavailable(fs_error("cannot rename the staged checkpoint to", final_dir, ec));
  }
  fsync_dir(root);
  if (keep > 0) {
    std::vector<std::string> all = list_checkpoints(root);
    for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i], ec);
  }
  return Status::ok();
}

Result<CheckpointManifest> open_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::not_found("checkpoint '" + path + "' does not exist");
  if (!fs::is_directory(path, ec))
    return Status::invalid("checkpoint '" + path +
                           "' is a file, not a checkpoint directory (a .safetensors file of "
                           "weights loads with --init)");
  if (fs::exists(fs::path(path) / "manifest.json", ec)) return read_manifest(path);
  const std::vector<std::string> all = list_checkpoints(path);
  if (all.empty())
    return Status::not_found("no complete checkpoint in '" + path +
                             "' (a checkpoint is a step-NNNNNNNN directory holding manifest.json)");
  return read_manifest(all.back());
}

Status CheckpointReader::check_file(const std::string& file) {
  if (checked_.count(file)) return Status::ok();
  const std::string path = (fs::path(m_.dir) / file).string();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return Status::not_found("checkpoint '" + m_.dir + "': file '" + file +
                             "' (listed in the manifest) is missing");
  const uint64_t want = m_.files.at(file).first;
  if (static_cast<uint64_t>(st.st_size) != want)
    return Status::invalid("checkpoint '" + m_.dir + "': file '" + file + "' has " +
                           std::to_string(st.st_size) + " bytes, the manifest says " +
                           std::to_string(want) + " (truncated or replaced)");
  checked_[file] = true;
  return Status::ok();
}

Status CheckpointReader::read(const std::string& name, const Shape& global,
                              const IndexRanges& ranges, Tensor* dst) {
  auto it = m_.tensors.find(name);
  if (it == m_.tensors.end())
    return Status::not_found("checkpoint '" + m_.dir + "' has no tensor '" + name + "'");
  const CheckpointTensor& t = it->second;
  if (!t.global.same_sizes(global))
    return Status::invalid("checkpoint '" + m_.dir + "': tensor '" + name + "' is " +
                           t.global.to_string() + " in the checkpoint but " + global.to_string() +
                           " in the model");
  if (t.dtype != dst->dtype())
    return Status::invalid("checkpoint '" + m_.dir + "': tensor '" + name + "' is " +
                           dtype_text(t.dtype) + " in the checkpoint but " +
                           dtype_text(dst->dtype()) + " in the model");
  MF_CHECK_EQ(volume(ranges), dst->numel()) << name;
  int64_t covered = 0;
  std::vector<char> buf;
  for (const CheckpointTensor::Block& b : t.blocks) {
    if (!overlaps(b.ranges, ranges)) continue;
    MF_RETURN_IF_ERROR(check_file(b.file));
    const std::string path = (fs::path(m_.dir) / b.file).string();
    buf.resize(static_cast<size_t>(volume(b.ranges)) * 4);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return Status::unavailable("checkpoint '" + m_.dir + "': cannot open '" + b.file +
                                 "': " + std::strerror(errno));
    size_t got = 0;
    while (got < buf.size()) {
      const ssize_t n =
          ::pread(fd, buf.data() + got, buf.size() - got, static_cast<off_t>(b.offset + got));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    ::close(fd);
    if (got != buf.size())
      return Status::invalid("checkpoint '" + m_.dir + "': file '" + b.file +
                             "' ends inside tensor '" + name + "'");
    if (crc32_of(buf.data(), buf.size()) != b.crc32)
      return Status::invalid("checkpoint '" + m_.dir + "': file '" + b.file + "': tensor '" + name +
                             "' block " + ranges_string(b.ranges) +
                             " is corrupt (CRC-32 does not match the manifest)");
    covered += copy_overlap(buf.data(), b.ranges, static_cast<char*>(dst->raw()), ranges);
  }
  if (covered != dst->numel())
    return Status::invalid("checkpoint '" + m_.dir + "': tensor '" + name + "' " +
                           ranges_string(ranges) + ": its blocks cover " + std::to_string(covered) +
                           " of " + std::to_string(dst->numel()) + " elements");
  return Status::ok();
}

Result<Tensor> CheckpointReader::read_whole(const std::string& name) {
  auto it = m_.tensors.find(name);
  if (it == m_.tensors.end())
    return Status::not_found("checkpoint '" + m_.dir + "' has no tensor '" + name + "'");
  Tensor t(it->second.global, it->second.dtype);
  IndexRanges all;
  for (const Dim& d : it->second.global.dims()) all.push_back({0, d.size});
  MF_RETURN_IF_ERROR(read(name, it->second.global, all, &t));
  return t;
}

}  // namespace meshflow
