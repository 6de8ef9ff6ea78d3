// framework/io/atomic_file.h: a write replaces the file whole and leaves no temp file, and a
// failed one (onto a directory, into a missing one, past the file size limit) leaves the old file
// and an error naming the path.
#include "framework/io/atomic_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <filesystem>
#include <string>
#include <vector>

#include "framework/error.h"
#include "tests/util/files.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using testing::DirEntries;
using testing::WriteText;

class IoTest : public testing::TempDirTest {};

TEST_F(IoTest, WriteFileAtomicReplacesAndLeavesNoTempFile) {
  const std::string path = Path("f.bin");
  WriteFileAtomic(path, "first");
  EXPECT_EQ(ReadFile(path), "first");
  std::string big(3 << 20, 'x');
  big[12345] = '\0';
  WriteFileAtomic(path, big);
  EXPECT_EQ(ReadFile(path), big);
  WriteFileAtomic(path, "");
  EXPECT_EQ(ReadFile(path), "");
  EXPECT_EQ(DirEntries(dir_), std::vector<std::string>{"f.bin"});
}

TEST_F(IoTest, WriteFileAtomicOntoADirectoryFailsCleanly) {
  const std::string target = Path("adir");
  fs::create_directory(target);
  WriteText(Path("adir/keep"), "k");
  try {
    WriteFileAtomic(target, "data");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(target), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("Is a directory"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(target));
  EXPECT_EQ(ReadFile(Path("adir/keep")), "k");
  EXPECT_EQ(DirEntries(dir_), std::vector<std::string>{"adir"});
}

TEST_F(IoTest, WriteFileAtomicIntoMissingDirectoryFails) {
  const std::string path = Path("no/such/dir/f.bin");
  try {
    WriteFileAtomic(path, "data");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(DirEntries(dir_).empty());
}

TEST_F(IoTest, WriteFileAtomicKeepsOldFileWhenAWriteFails) {
  // A file-size limit makes write() fail half way (EFBIG), the way a full disk would.
  const std::string path = Path("ckpt.bin");
  WriteFileAtomic(path, "old contents");
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string error;
  try {
    WriteFileAtomic(path, std::string(1 << 20, 'n'));
  } catch (const Error& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("File too large"), std::string::npos) << error;
  EXPECT_EQ(ReadFile(path), "old contents");
  EXPECT_EQ(DirEntries(dir_), std::vector<std::string>{"ckpt.bin"});
}

TEST_F(IoTest, ReadFileNamesMissingPath) {
  const std::string path = Path("missing.bin");
  try {
    ReadFile(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
  }
  EXPECT_THROW(ReadFile(dir_), Error);
}
}  // namespace
}  // namespace keel
