// framework/summary: TFRecord framing, CRC-32C, and event files that TensorBoard's own reader
// (the `tensorboard` pip package) reads back with the values written, from C++ and from
// `keel train --logdir`.
#include "framework/summary/summary_writer.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "framework/error.h"
#include "tests/util/golden.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') names.push_back(e->d_name);
    ::closedir(d);
  }
  return names;
}

TEST(Crc32c, MatchesTheCastagnoliCheckValue) {
  // The standard check input "123456789" (RFC 3720 appendix B.4 lists CRC-32C test vectors).
  EXPECT_EQ(summary::Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(summary::Crc32c("", 0), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(summary::Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
}

TEST(TFRecord, FramesLengthDataAndMaskedCrcs) {
  std::string rec = summary::FrameRecord("abc");
  ASSERT_EQ(rec.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(static_cast<uint8_t>(rec[0]), 3);
  for (int i = 1; i < 8; ++i) EXPECT_EQ(rec[i], 0);
  uint32_t header_crc, data_crc;
  std::memcpy(&header_crc, rec.data() + 8, 4);
  std::memcpy(&data_crc, rec.data() + 15, 4);
  EXPECT_EQ(header_crc, summary::MaskedCrc32c(rec.data(), 8));
  EXPECT_EQ(data_crc, summary::MaskedCrc32c("abc", 3));
  EXPECT_EQ(rec.substr(12, 3), "abc");
}

TEST(SummaryWriter, TensorboardReadsBackEveryScalar) {
  if (!HaveTensorboard()) GTEST_SKIP() << "python tensorboard not installed (tools/setup.sh)";
  std::string dir = MakeTempDir() + "/run/a";  // parents are created
  {
    SummaryWriter w(dir);
    for (int step = 0; step < 50; ++step) {
      w.AddScalar("train/loss", 1.0 / (step + 1), step);
      if (step % 10 == 0) w.AddScalar("eval/accuracy", 0.5 + step / 100.0, step);
    }
    w.AddScalar("zero", 0.0, 7);
    w.Flush();
    EXPECT_NE(w.path().find("/events.out.tfevents."), std::string::npos) << w.path();
  }
  auto got = ReadTensorboardScalars(dir);
  ASSERT_EQ(got["train/loss"].size(), 50u);
  for (int step = 0; step < 50; ++step)
    EXPECT_NEAR(got["train/loss"][step], 1.0 / (step + 1), 1e-6);
  ASSERT_EQ(got["eval/accuracy"].size(), 5u);
  EXPECT_NEAR(got["eval/accuracy"][40], 0.9, 1e-6);
  ASSERT_EQ(got["zero"].size(), 1u);
  EXPECT_EQ(got["zero"][7], 0.0);
  RunCommand("rm -rf " + dir);
}

TEST(SummaryWriter, TwoWritersInOneFolderMakeTwoFilesOfOneRun) {
  std::string dir = MakeTempDir();
  {
    SummaryWriter a(dir), b(dir);
    EXPECT_NE(a.path(), b.path());
    a.AddScalar("x", 1, 0);
    b.AddScalar("x", 2, 1);
  }
  EXPECT_EQ(ListDir(dir).size(), 2u);
  if (HaveTensorboard()) {
    auto got = ReadTensorboardScalars(dir);
    EXPECT_EQ(got["x"].size(), 2u);
  }
  RunCommand("rm -rf " + dir);
}

TEST(SummaryWriter, UnwritableLogdirIsAnErrorNamingIt) {
  std::string dir = MakeTempDir();
  std::ofstream(dir + "/file") << "x";
  try {
    SummaryWriter w(dir + "/file/sub");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(SummaryWriter(dir).AddScalar("", 1, 0), Error);
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
