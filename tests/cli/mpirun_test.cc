// keel under OpenMPI's real mpirun (Debian openmpi-bin): `mpirun -np 2 keel train` trains with
// the rank from OMPI_COMM_WORLD_*, the rendezvous address from MASTER_ADDR/MASTER_PORT, a job
// token derived from OpenMPI's per-job key, and each rank's math threads its share of the CPUs,
// and ends with the parameters `keel launch` gives. Skipped with a message without mpirun.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

namespace fs = std::filesystem;

class MpirunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RunCommand("command -v mpirun").exit_code != 0)
      GTEST_SKIP() << "mpirun not found: install Debian's openmpi-bin (tools/setup.sh does)";
    dir_ = MakeTempDir();
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // Root may run mpirun only when it says so; --oversubscribe: more ranks than cores is fine here.
  std::string Mpirun(int np, const std::string& extra = "") const {
    return "env -u KEEL_JOB_TOKEN -u FLAGS_cpu_math_threads -u RANK -u WORLD_SIZE mpirun "
           "--allow-run-as-root --oversubscribe -np " +
           std::to_string(np) + " " + extra + " ";
  }
  std::string dir_;
};

TEST_F(MpirunTest, TwoRanksTrainToTheParametersOfKeelLaunch) {
  const std::string train = BinPath("keel") +
                            " train --model=mlp --mlp_hidden=64 --optimizer=adam --seed=2 "
                            "--steps=20";
  auto mpi = RunCommand(
      Mpirun(2, "-x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=" + std::to_string(FreePort())) + train +
      " --save_dir=" + dir_ + "/mpi");
  ASSERT_EQ(mpi.exit_code, 0) << mpi.output;
  EXPECT_TRUE(Contains(mpi.output, "2 worker(s)")) << mpi.output;
  EXPECT_TRUE(Contains(mpi.output, "source=openmpi")) << mpi.output;
  // Threads: each rank's share, as keel launch computes it.
  EXPECT_TRUE(Contains(mpi.output, "workers on this node, OMPI_COMM_WORLD_LOCAL_SIZE)"))
      << mpi.output;
  auto launch = RunCommand("env -u KEEL_JOB_TOKEN " + BinPath("keel") +
                           " launch --nproc_per_node=2 --log_dir=" + dir_ + "/log " + train +
                           " --save_dir=" + dir_ + "/launch");
  ASSERT_EQ(launch.exit_code, 0) << launch.output;
  EXPECT_EQ(CheckpointTensorBytes(dir_ + "/mpi"), CheckpointTensorBytes(dir_ + "/launch"));
}

TEST_F(MpirunTest, AMissingRendezvousAddressIsNamed) {
  auto r = RunCommand(Mpirun(2) + "env -u MASTER_ADDR -u MASTER_PORT " + BinPath("keel") +
                      " train --model=mlp --mlp_hidden=16 --steps=2");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(Contains(r.output, "MASTER_ADDR")) << r.output;
  EXPECT_TRUE(Contains(r.output, "openmpi")) << r.output;
}

}  // namespace
}  // namespace keel::testing
