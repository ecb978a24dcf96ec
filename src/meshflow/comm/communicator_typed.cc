// The Communicator's typed collectives (communicator.h): bytes of any dtype
// moved as f32 words through the f32 algorithms (send/recv move bytes
// directly: communicator.cc), bf16/f16 reduced in f32,
// integers reduced exactly after a gather.
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "meshflow/comm/communicator.h"
#include "meshflow/core/check.h"

namespace meshflow {

namespace {

int64_t bytes_of(int64_t count, DType dt) {
  return count * static_cast<int64_t>(dtype_size(dt));
}

// f32 words that hold `bytes` (the last one zero-padded).
int64_t words_of(int64_t bytes) {
  return (bytes + 3) / 4;
}

bool is_float16(DType dt) {
  return dt == DType::BF16 || dt == DType::F16;
}
bool is_integer(DType dt) {
  return dt == DType::I32 || dt == DType::I64;
}

void to_f32(const void* in, int64_t count, DType dt, float* out) {
  const auto* h = static_cast<const uint16_t*>(in);
  for (int64_t i = 0; i < count; ++i)
    out[i] = dt == DType::BF16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
}
void from_f32(const float* in, int64_t count, DType dt, void* out) {
  auto* h = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < count; ++i)
    h[i] = dt == DType::BF16 ? f32_to_bf16(in[i]) : f32_to_f16(in[i]);
}

int64_t load_int(const char* p, DType dt) {
  if (dt == DType::I32) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void store_int(int64_t v, DType dt, char* p) {
  if (dt == DType::I32) {
    const int32_t w = static_cast<int32_t>(v);  // sums wrap as the i32 values would
    std::memcpy(p, &w, sizeof w);
  } else {
    std::memcpy(p, &v, sizeof v);
  }
}

// out[i] = op over the n blocks of `count` elements in `blocks`, in rank order.
void reduce_ints(const char* blocks, int n, int64_t count, DType dt, ReduceOp op, char* out) {
  const size_t e = dtype_size(dt);
  for (int64_t i = 0; i < count; ++i) {
    int64_t acc = load_int(blocks + i * e, dt);
    for (int r = 1; r < n; ++r) {
      const int64_t v = load_int(blocks + (r * count + i) * e, dt);
      acc = op == ReduceOp::kSum
                ? static_cast<int64_t>(static_cast<uint64_t>(acc) + static_cast<uint64_t>(v))
                : std::max(acc, v);
    }
    store_int(acc, dt, out + i * e);
  }
}

// The typed forms' own argument check (before any padding copy): a negative
// count or a null buffer is the caller's error, named with what is valid.
Status check_args(const char* what, int64_t count, DType dt,
                  std::initializer_list<const void*> ps) {
  const std::string w =
      std::string(what) + "(" + std::to_string(count) + " " + std::string(dtype_name(dt)) + ")";
  if (count < 0) return Status::invalid(w + ": count must be >= 0, got " + std::to_string(count));
  for (const void* p : ps)
    if (count > 0 && p == nullptr) return Status::invalid(w + ": null buffer");
  return Status::ok();
}

}  // namespace

Status Communicator::all_gather(const void* in, int64_t count, void* out, DType dt) {
  MF_RETURN_IF_ERROR(check_args("all_gather", count, dt, {in, out}));
  const int64_t bytes = bytes_of(count, dt);
  if (bytes % 4 == 0)
    return all_gather(static_cast<const float*>(in), bytes / 4, static_cast<float*>(out));
  const int64_t w = words_of(bytes), n = size();
  std::vector<float> mine(w, 0.f), all(w * n);
  std::memcpy(mine.data(), in, bytes);
  MF_RETURN_IF_ERROR(all_gather(mine.data(), w, all.data()));
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(static_cast<char*>(out) + r * bytes, all.data() + r * w, bytes);
  return Status::ok();
}

Status Communicator::all_to_all(const void* in, int64_t count_per_rank, void* out, DType dt) {
  MF_RETURN_IF_ERROR(check_args("all_to_all", count_per_rank, dt, {in, out}));
  const int64_t bytes = bytes_of(count_per_rank, dt);
  if (bytes % 4 == 0)
    return all_to_all(static_cast<const float*>(in), bytes / 4, static_cast<float*>(out));
  const int64_t w = words_of(bytes), n = size();
  std::vector<float> send(w * n, 0.f), recv(w * n);
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(send.data() + r * w, static_cast<const char*>(in) + r * bytes, bytes);
  MF_RETURN_IF_ERROR(all_to_all(send.data(), w, recv.data()));
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(static_cast<char*>(out) + r * bytes, recv.data() + r * w, bytes);
  return Status::ok();
}

Status Communicator::broadcast(void* data, int64_t count, DType dt, int root) {
  MF_RETURN_IF_ERROR(check_args("broadcast", count, dt, {data}));
  const int64_t bytes = bytes_of(count, dt);
  if (bytes % 4 == 0) return broadcast(static_cast<float*>(data), bytes / 4, root);
  std::vector<float> buf(words_of(bytes), 0.f);
  std::memcpy(buf.data(), data, bytes);
  MF_RETURN_IF_ERROR(broadcast(buf.data(), static_cast<int64_t>(buf.size()), root));
  std::memcpy(data, buf.data(), bytes);
  return Status::ok();
}

Status Communicator::all_reduce(void* data, int64_t count, DType dt, ReduceOp op) {
  MF_RETURN_IF_ERROR(check_args("all_reduce", count, dt, {data}));
  if (dt == DType::F32) return all_reduce(static_cast<float*>(data), count, op);
  if (is_float16(dt)) {
    std::vector<float> f(count);
    to_f32(data, count, dt, f.data());
    MF_RETURN_IF_ERROR(all_reduce(f.data(), count, op));
    from_f32(f.data(), count, dt, data);
    return Status::ok();
  }
  MF_CHECK(is_integer(dt));
  std::vector<char> all(static_cast<size_t>(bytes_of(count, dt) * size()));
  MF_RETURN_IF_ERROR(all_gather(data, count, all.data(), dt));
  reduce_ints(all.data(), size(), count, dt, op, static_cast<char*>(data));
  return Status::ok();
}

Status Communicator::reduce_scatter(const void* in, int64_t count_per_rank, void* out, DType dt,
                                    ReduceOp op) {
  MF_RETURN_IF_ERROR(check_args("reduce_scatter", count_per_rank, dt, {in, out}));
  if (dt == DType::F32)
    return reduce_scatter(static_cast<const float*>(in), count_per_rank, static_cast<float*>(out),
                          op);
  const int64_t total = count_per_rank * size();
  if (is_float16(dt)) {
    std::vector<float> f(total), mine(count_per_rank);
    to_f32(in, total, dt, f.data());
    MF_RETURN_IF_ERROR(reduce_scatter(f.data(), count_per_rank, mine.data(), op));
    from_f32(mine.data(), count_per_rank, dt, out);
    return Status::ok();
  }
  MF_CHECK(is_integer(dt));
  // Block r of every rank's input lands on rank r, in rank order.
  std::vector<char> blocks(static_cast<size_t>(bytes_of(total, dt)));
  MF_RETURN_IF_ERROR(all_to_all(in, count_per_rank, blocks.data(), dt));
  reduce_ints(blocks.data(), size(), count_per_rank, dt, op, static_cast<char*>(out));
  return Status::ok();
}

}  // namespace meshflow
