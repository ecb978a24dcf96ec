// The files a user names: inputs only when regular and small enough, outputs
// checked without being changed, atomic writes that never replace a device.
#include "meshflow/core/file_io.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "meshflow/io/safetensors.h"
#include "temp_dir_test.h"

namespace meshflow {
namespace {

namespace fs = std::filesystem;

#define EXPECT_HAS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

class FileIo : public meshflow::testing::TempDirTest {
 protected:
};

TEST_F(FileIo, ReadsARegularFile) {
  std::ofstream(path("a.json")) << "{\"x\": 1}";
  Result<std::string> r = read_regular_file(path("a.json"));
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, "{\"x\": 1}");
}

TEST_F(FileIo, RefusesWhatIsNotARegularFile) {
  Result<std::string> r = read_regular_file("/dev/zero");
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "'/dev/zero' is not a regular file (it is a character device)");
  ASSERT_EQ(::mkfifo(path("f").c_str(), 0600), 0);
  r = read_regular_file(path("f"));  // returns at once: no writer is awaited
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "a FIFO");
  r = read_regular_file(dir_.string());
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "is a directory");
  r = read_regular_file(path("missing"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

TEST_F(FileIo, RefusesFilesOverTheLimit) {
  std::ofstream(path("big")) << std::string(1001, 'x');
  Result<std::string> r = read_regular_file(path("big"), 1000);
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "larger than the 1000 bytes limit");
  EXPECT_TRUE(read_regular_file(path("big"), 1001).is_ok());
  // Files that report no size (/proc) are still bounded by what is read.
  r = read_regular_file("/proc/self/maps", 16);
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "16 bytes limit");
}

TEST_F(FileIo, CheckOutputFileChangesNothing) {
  std::ofstream(path("old")) << "keep";
  EXPECT_TRUE(check_output_file(path("old"), "--out").is_ok());
  EXPECT_EQ(fs::file_size(path("old")), 4u);  // not truncated
  EXPECT_TRUE(check_output_file(path("new"), "--out").is_ok());
  EXPECT_FALSE(fs::exists(path("new")));  // not created
  EXPECT_HAS(check_output_file(path("no/new"), "--out").message(), "does not exist");
  EXPECT_HAS(check_output_file(dir_.string(), "--out").message(), "is a directory");
  EXPECT_HAS(check_output_file("/dev/full", "--out").message(), "not a regular file");
  EXPECT_TRUE(check_output_file("/dev/null", "--metrics", OutputTarget::kStream).is_ok());
}

TEST_F(FileIo, AtomicWriteReplacesFilesButNeverDevices) {
  ASSERT_TRUE(write_file_atomic(path("a"), "one", "--out").is_ok());
  ASSERT_TRUE(write_file_atomic(path("a"), "two!", "--out").is_ok());
  EXPECT_EQ(fs::file_size(path("a")), 4u);
  EXPECT_FALSE(fs::exists(path("a.tmp")));
  // A FIFO stands for a device node (a regression replaces only it).
  const std::string node = path("node");
  ASSERT_EQ(::mkfifo(node.c_str(), 0600), 0);
  Status s = write_file_atomic(node, "x", "--out");
  EXPECT_HAS(s.message(), "--out '" + node + "' is not a regular file (it is a FIFO)");
  struct stat st;
  ASSERT_EQ(::stat(node.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_FALSE(fs::exists(node + ".tmp"));
}

TEST_F(FileIo, SafetensorsNeverRenamesOverASpecialFile) {
  const std::string node = path("node");
  ASSERT_EQ(::mkfifo(node.c_str(), 0600), 0);
  Tensor t(Shape{{"x", 2}}, DType::F32);
  Status s = write_safetensors(node, {{"a", t}});
  EXPECT_HAS(s.message(), "'" + node + "': not a regular file (it is a FIFO)");
  struct stat st;
  ASSERT_EQ(::stat(node.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_FALSE(fs::exists(node + ".tmp"));
  Result<SafetensorsFile> r = read_safetensors("/dev/zero");
  ASSERT_FALSE(r.is_ok());
  EXPECT_HAS(r.status().message(), "not a regular file");
}

}  // namespace
}  // namespace meshflow
