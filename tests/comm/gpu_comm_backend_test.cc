// --gpu_comm_backend's choice for a ring of CUDA tensors (framework/comm/communicator.h's
// ChooseGpuCommBackend), from every rank's GPU identity: auto takes NCCL only when it is built in
// and no two ranks share a GPU; nccl with a shared GPU is refused naming both flags.
#include <gtest/gtest.h>

#include "framework/comm/communicator.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace {

using testing::ErrorOf;
using testing::ExpectErrorContainsAll;

const std::vector<std::string> kOwn = {"GPU-a", "GPU-b", "GPU-c"};
const std::vector<std::string> kShared = {"GPU-a", "GPU-b", "GPU-a"};

TEST(GpuCommBackend, AutoIsNcclOnlyWhenEveryRankHasItsOwnGpuAndNcclIsBuilt) {
  EXPECT_EQ(ChooseGpuCommBackend("auto", true, kOwn, 0), "nccl");
  EXPECT_EQ(ChooseGpuCommBackend("auto", true, kShared, 0), "host");
  EXPECT_EQ(ChooseGpuCommBackend("auto", false, kOwn, 0), "host");
  EXPECT_EQ(ChooseGpuCommBackend("auto", true, {"GPU-a"}, 0), "nccl");
}

TEST(GpuCommBackend, HostAndNcclAreTakenAsAsked) {
  EXPECT_EQ(ChooseGpuCommBackend("host", true, kOwn, 0), "host");
  EXPECT_EQ(ChooseGpuCommBackend("host", false, kShared, 0), "host");
  EXPECT_EQ(ChooseGpuCommBackend("nccl", true, kOwn, 0), "nccl");
}

TEST(GpuCommBackend, NcclOnASharedGpuOrWithoutNcclIsRefused) {
  ExpectErrorContainsAll(ErrorOf([] { ChooseGpuCommBackend("nccl", true, kShared, 1); }),
                         {"ring 1", "ranks 0 and 2", "GPU-a", "Duplicate GPU", "--selected_gpus",
                          "--gpu_comm_backend=host", "--gpu_comm_backend=nccl"});
  ExpectErrorContainsAll(ErrorOf([] { ChooseGpuCommBackend("nccl", false, kOwn, 0); }),
                         {"--gpu_comm_backend=nccl", "without NCCL"});
  ExpectErrorContainsAll(ErrorOf([] { ChooseGpuCommBackend("mpi", true, kOwn, 0); }),
                         {"--gpu_comm_backend", "auto, nccl or host", "'mpi'"});
}

}  // namespace
}  // namespace keel
