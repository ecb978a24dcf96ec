// TempDirTest: a test fixture with a directory of its own, dir_, created
// before each test and removed after it. Its name holds the suite, the
// process and the test, so tests of one binary or of parallel binaries
// (ctest -j) never share one.
//
//   class MyCli : public meshflow::testing::TempDirTest {};
//   TEST_F(MyCli, Writes) { std::ofstream(path("run.json")) << "{}"; }
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

namespace meshflow::testing {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string("meshflow_") + t->test_suite_name() + "_" +
                       std::to_string(::getpid()) + "_" + t->name();
    std::replace(name.begin(), name.end(), '/', '_');  // parameterized names
    dir_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A file in dir_.
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

}  // namespace meshflow::testing
