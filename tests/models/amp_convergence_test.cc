// Mixed precision converges like float32: LeNet trained on the real MNIST test set (its first
// 8,000 images; evaluated on the last 2,000) in float32, bfloat16 AMP O1 and bfloat16 AMP O2 each
// reaches 97 % test accuracy in the same short run. Skips, saying where it looked, without MNIST.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "tests/util/subprocess.h"
#include "tests/util/test_data.h"

namespace keel::testing {
namespace {

std::vector<double> Accuracies(const std::string& out) {
  std::vector<double> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    long long epoch;
    double acc;
    if (std::sscanf(line.c_str(), "epoch %lld test_accuracy %lf", &epoch, &acc) == 2)
      v.push_back(acc);
  }
  return v;
}

TEST(AmpConvergence, Bf16O1AndO2TrainLenetOnMnistToNinetySevenPercentLikeFloat32) {
  if (!HaveMnist()) GTEST_SKIP() << "MNIST not found in " << MnistDir() << " (set KEEL_MNIST_DIR)";
  const int kEpochs = 6;
  for (const char* amp : {"", " --amp=bf16 --amp_level=O1", " --amp=bf16 --amp_level=O2"}) {
    SCOPED_TRACE(amp[0] ? amp : " float32");
    auto r = RunCommand(BinPath("keel") + " train --model=lenet --data=mnist:" + MnistDir() +
                        " --epochs=" + std::to_string(kEpochs) +
                        " --batch_size=64 --seed=1 --fetch_frequency=1000" + amp);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> acc = Accuracies(r.output);
    ASSERT_EQ(acc.size(), static_cast<size_t>(kEpochs)) << r.output;
    std::printf("%s: test accuracy %.4f\n", amp[0] ? amp : " float32", acc.back());
    EXPECT_GE(acc.back(), 0.97) << r.output;
  }
  // What ran was low precision: O2's LeNet holds bfloat16 weights with float32 masters.
  auto o2 = RunCommand(BinPath("keel") +
                       " inspect --strategy --nranks=1 --program=main --model=lenet --amp=bf16 "
                       "--amp_level=O2 2>/dev/null");
  EXPECT_NE(o2.output.find("conv2d_0.w_0 : bfloat16["), std::string::npos) << o2.output;
  EXPECT_NE(o2.output.find("conv2d_0.w_0.master : float32["), std::string::npos) << o2.output;
}

}  // namespace
}  // namespace keel::testing
