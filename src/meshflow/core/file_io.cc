#include "meshflow/core/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace meshflow {

namespace {

std::string quoted(const std::string& path) {
  return "'" + path + "'";
}

std::string limit_text(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

// The directory a new file `path` would be created in ("." for a bare name).
std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Closes a file descriptor on every path out of a scope.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string file_kind_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFIFO:
      return "a FIFO";
    case S_IFSOCK:
      return "a socket";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "not a file";
  }
}

Result<std::string> read_regular_file(const std::string& path, int64_t max_bytes) {
  if (path.empty()) return Status::invalid("empty file name");
  // O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer
  // (it is refused below); it changes nothing for regular files.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)};
  if (f.fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Status::not_found("cannot open " + quoted(path) + ": no such file");
    return Status::invalid("cannot open " + quoted(path) + ": " + std::strerror(e));
  }
  struct stat st;
  if (::fstat(f.fd, &st) != 0)
    return Status::invalid("cannot read " + quoted(path) + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode))
    return Status::invalid(quoted(path) + " is a directory; give the path of a file");
  if (!S_ISREG(st.st_mode))
    return Status::invalid(quoted(path) + " is not a regular file (it is " +
                           file_kind_name(st.st_mode) + "); give the path of a file");
  const std::string too_big =
      quoted(path) + " is larger than the " + limit_text(max_bytes) + " limit for input files";
  if (st.st_size > max_bytes) return Status::invalid(too_big);
  // Read at most max_bytes + 1: a file that grows (or reports size 0, as
  // /proc files do) is still bounded.
  std::string data;
  data.resize(static_cast<size_t>(st.st_size) + 1);
  size_t have = 0;
  while (true) {
    if (have == data.size()) {
      if (static_cast<int64_t>(have) > max_bytes) return Status::invalid(too_big);
      data.resize(std::min<size_t>(data.size() * 2 + 4096, static_cast<size_t>(max_bytes) + 1));
    }
    const ssize_t n = ::read(f.fd, data.data() + have, data.size() - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::invalid("cannot read " + quoted(path) + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
  }
  if (static_cast<int64_t>(have) > max_bytes) return Status::invalid(too_big);
  data.resize(have);
  return data;
}

Status check_output_file(const std::string& path, const std::string& what, OutputTarget target) {
  const std::string name = what + " " + quoted(path);
  if (path.empty()) return Status::invalid(what + ": empty file name; give the path of a file");
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode))
      return Status::invalid(name + " is a directory; give a file name (e.g. " +
                             (path.back() == '/' ? path : path + "/") + "out)");
    const bool ok_kind =
        S_ISREG(st.st_mode) || (target == OutputTarget::kStream && S_ISCHR(st.st_mode));
    if (!ok_kind)
      return Status::invalid(name + " is not a regular file (it is " + file_kind_name(st.st_mode) +
                             "); give the path of a file to write");
    // Proves it can be written without changing it: append, no truncation.
    Fd f{::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)};
    if (f.fd < 0) return Status::invalid(name + " cannot be written: " + std::strerror(errno));
    return Status::ok();
  }
  const int e = errno;
  if (e != ENOENT) return Status::invalid(name + ": " + std::strerror(e));
  const std::string dir = parent_dir(path);
  struct stat dst;
  if (::stat(dir.c_str(), &dst) != 0)
    return Status::invalid(name + ": directory " + quoted(dir) + " does not exist (" +
                           std::strerror(errno) + ")");
  if (!S_ISDIR(dst.st_mode))
    return Status::invalid(name + ": " + quoted(dir) + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return Status::invalid(name + ": directory " + quoted(dir) + " is not writable (" +
                           std::strerror(errno) + ")");
  return Status::ok();
}

Status write_file_atomic(const std::string& path, const std::string& data,
                         const std::string& what) {
  MF_RETURN_IF_ERROR(check_output_file(path, what));
  const std::string tmp = path + ".tmp";
  const std::string name = what + " " + quoted(path);
  ::unlink(tmp.c_str());  // a stale temporary of ours; O_EXCL then creates a fresh file
  Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
  if (f.fd < 0)
    return Status::invalid(name + ": cannot create " + quoted(tmp) + ": " + std::strerror(errno));
  auto fail = [&](const std::string& doing) {
    Status s = Status::unavailable(name + ": " + doing + ": " + std::strerror(errno));
    ::unlink(tmp.c_str());
    return s;
  };
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const ssize_t n = ::write(f.fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("cannot write");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) return fail("cannot write");
  // The target may have changed since the check: never rename over a non-file.
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    ::unlink(tmp.c_str());
    return Status::invalid(name + " is not a regular file (it is " + file_kind_name(st.st_mode) +
                           "); give the path of a file to write");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot rename " + quoted(tmp));
  return Status::ok();
}

}  // namespace meshflow
