// Role makers: every environment convention, complete or half-set, contradictions, malformed
// values, local ranks from Paddle endpoints, and the user-defined role.
#include "fleet/role_maker.h"

#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>

#include "framework/error.h"
#include "tests/util/op_test_util.h"

namespace keel {
namespace fleet {
namespace {

using Env = std::map<std::string, std::string>;

using testing::ErrorOf;

std::string Print(const Env& env) {
  std::string s;
  for (const auto& [k, v] : env) s += k + "=" + v + " ";
  return s;
}

const std::string kFourOnTwoHosts = "10.0.0.1:6170,10.0.0.1:6171,10.0.0.2:6170,10.0.0.2:6171";

// ---------------------------------------------------------------------------------------------
// Environments that make a role.

struct GoodCase {
  const char* intent;
  Env env;
  std::string role;  // Role::ToString()
};

const std::vector<GoodCase>& GoodCases() {
  static const std::vector<GoodCase> cases = {
      {"no variables: one worker",
       {},
       "rank 0/1 local 0/1 node 0/1 source=none store=127.0.0.1:0 gpus=none"},
      {"rendezvous variables alone make no convention",
       {{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}},
       "rank 0/1 local 0/1 node 0/1 source=none store=node0:29500 gpus=none"},
      {"Slurm allocation variables alone (an salloc shell) make no task",
       {{"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "4"}},
       "rank 0/1 local 0/1 node 0/1 source=none store=127.0.0.1:0 gpus=none"},
      {"FLAGS_selected_gpus is read without any convention",
       {{"FLAGS_selected_gpus", "3"}},
       "rank 0/1 local 0/1 node 0/1 source=none store=127.0.0.1:0 gpus=3"},
      {"paddle, single trainer without endpoints",
       {{"PADDLE_TRAINER_ID", "0"}, {"PADDLE_TRAINERS_NUM", "1"}},
       "rank 0/1 local 0/1 node 0/1 source=paddle store=127.0.0.1:0 gpus=none"},
      {"paddle, single trainer with only its current endpoint",
       {{"PADDLE_TRAINER_ID", "0"},
        {"PADDLE_TRAINERS_NUM", "1"},
        {"PADDLE_CURRENT_ENDPOINT", "127.0.0.1:6170"}},
       "rank 0/1 local 0/1 node 0/1 source=paddle store=127.0.0.1:6170 endpoint=127.0.0.1:6170 "
       "gpus=none"},
      {"paddle, 4 ranks on 2 hosts, rank 3",
       {{"PADDLE_TRAINER_ID", "3"},
        {"PADDLE_TRAINERS_NUM", "4"},
        {"PADDLE_TRAINER_ENDPOINTS", kFourOnTwoHosts},
        {"PADDLE_CURRENT_ENDPOINT", "10.0.0.2:6171"},
        {"FLAGS_selected_gpus", "1"}},
       "rank 3/4 local 1/2 node 1/2 source=paddle store=10.0.0.1:6170 endpoint=10.0.0.2:6171 "
       "gpus=1"},
      {"paddle, 2 ranks on one host without PADDLE_CURRENT_ENDPOINT",
       {{"PADDLE_TRAINER_ID", "1"},
        {"PADDLE_TRAINERS_NUM", "2"},
        {"PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:6170,127.0.0.1:6171"}},
       "rank 1/2 local 1/2 node 0/1 source=paddle store=127.0.0.1:6170 endpoint=127.0.0.1:6171 "
       "gpus=none"},
      {"paddle, bracketed IPv6 endpoints",
       {{"PADDLE_TRAINER_ID", "0"},
        {"PADDLE_TRAINERS_NUM", "2"},
        {"PADDLE_TRAINER_ENDPOINTS", "[::1]:6170,[::1]:6171"}},
       "rank 0/2 local 0/2 node 0/1 source=paddle store=[::1]:6170 endpoint=[::1]:6170 gpus=none"},
      {"keel launch: paddle and torchrun both set and agreeing",
       {{"PADDLE_TRAINER_ID", "2"},
        {"PADDLE_TRAINERS_NUM", "4"},
        {"PADDLE_TRAINER_ENDPOINTS", kFourOnTwoHosts},
        {"PADDLE_CURRENT_ENDPOINT", "10.0.0.2:6170"},
        {"RANK", "2"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_RANK", "0"},
        {"LOCAL_WORLD_SIZE", "2"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "6170"},
        {"FLAGS_selected_gpus", "0"}},
       "rank 2/4 local 0/2 node 1/2 source=paddle store=10.0.0.1:6170 endpoint=10.0.0.2:6170 "
       "gpus=0"},
      {"torchrun, complete",
       {{"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"MASTER_ADDR", "node0"},
        {"MASTER_PORT", "29500"}},
       "rank 5/8 local 1/4 node 1/2 source=torchrun store=node0:29500 gpus=none"},
      {"torchrun / Kubeflow without LOCAL_*: one node",
       {{"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "job-master-0"},
        {"MASTER_PORT", "23456"}},
       "rank 1/2 local 1/2 node 0/1 source=torchrun store=job-master-0:23456 gpus=none"},
      {"torchrun, single worker needs no master",
       {{"RANK", "0"}, {"WORLD_SIZE", "1"}},
       "rank 0/1 local 0/1 node 0/1 source=torchrun store=127.0.0.1:0 gpus=none"},
      {"torchrun, LOCAL_WORLD_SIZE alone gives the local rank",
       {{"RANK", "3"},
        {"WORLD_SIZE", "4"},
        {"LOCAL_WORLD_SIZE", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "1"}},
       "rank 3/4 local 1/2 node 1/2 source=torchrun store=h:1 gpus=none"},
      {"openmpi, complete",
       {{"OMPI_COMM_WORLD_RANK", "6"},
        {"OMPI_COMM_WORLD_SIZE", "8"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
        {"MASTER_ADDR", "10.1.1.1"},
        {"MASTER_PORT", "7000"}},
       "rank 6/8 local 2/4 node 1/2 source=openmpi store=10.1.1.1:7000 gpus=none"},
      {"slurm, SLURM_TASKS_PER_NODE with a repeat count",
       {{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_TASKS_PER_NODE", "2(x2)"},
        {"MASTER_ADDR", "n1"},
        {"MASTER_PORT", "29400"}},
       "rank 3/4 local 1/2 node 1/2 source=slurm store=n1:29400 gpus=none"},
      {"slurm, SLURM_NTASKS_PER_NODE agreeing with SLURM_TASKS_PER_NODE",
       {{"SLURM_PROCID", "2"},
        {"SLURM_NTASKS", "6"},
        {"SLURM_LOCALID", "2"},
        {"SLURM_NTASKS_PER_NODE", "3"},
        {"SLURM_TASKS_PER_NODE", "3,3"},
        {"MASTER_ADDR", "n1"},
        {"MASTER_PORT", "29400"}},
       "rank 2/6 local 2/3 node 0/2 source=slurm store=n1:29400 gpus=none"},
      {"srun launching torchrun per node: slurm describes the launcher and is not read",
       {{"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "0"},
        {"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"MASTER_ADDR", "n0"},
        {"MASTER_PORT", "29500"}},
       "rank 5/8 local 1/4 node 1/2 source=torchrun store=n0:29500 gpus=none"},
      {"mpirun inside a Slurm allocation: openmpi wins",
       {{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", "0"},
        {"OMPI_COMM_WORLD_RANK", "1"},
        {"OMPI_COMM_WORLD_SIZE", "2"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
        {"MASTER_ADDR", "n0"},
        {"MASTER_PORT", "29500"}},
       "rank 1/2 local 1/2 node 0/1 source=openmpi store=n0:29500 gpus=none"},
      {"paddle without PADDLE_TRAINERS_NUM: the world is the endpoint count, as in Paddle",
       {{"PADDLE_TRAINER_ID", "1"}, {"PADDLE_TRAINER_ENDPOINTS", "10.0.0.1:6170,10.0.0.2:6170"}},
       "rank 1/2 local 0/1 node 1/2 source=paddle store=10.0.0.1:6170 endpoint=10.0.0.2:6170 "
       "gpus=none"},
      {"mpirun starting one torchrun per node: OpenMPI's world is the launchers'",
       {{"OMPI_COMM_WORLD_RANK", "1"},
        {"OMPI_COMM_WORLD_SIZE", "2"},
        {"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"MASTER_ADDR", "n0"},
        {"MASTER_PORT", "29500"}},
       "rank 5/8 local 1/4 node 1/2 source=torchrun store=n0:29500 gpus=none"},
      {"mpirun with RANK agreeing with OpenMPI's",
       {{"OMPI_COMM_WORLD_RANK", "1"},
        {"OMPI_COMM_WORLD_SIZE", "2"},
        {"RANK", "1"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "n0"},
        {"MASTER_PORT", "29500"}},
       "rank 1/2 local 1/2 node 0/1 source=torchrun store=n0:29500 gpus=none"},
      {"FLAGS_selected_gpus empty means none",
       {{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"FLAGS_selected_gpus", ""}},
       "rank 0/1 local 0/1 node 0/1 source=torchrun store=127.0.0.1:0 gpus=none"},
      {"FLAGS_selected_gpus with several GPUs",
       {{"FLAGS_selected_gpus", "2,0,1"}},
       "rank 0/1 local 0/1 node 0/1 source=none store=127.0.0.1:0 gpus=2,0,1"},
  };
  return cases;
}

TEST(CloudRoleMaker, ReadsEveryConvention) {
  for (const GoodCase& c : GoodCases()) {
    SCOPED_TRACE(std::string(c.intent) + " | " + Print(c.env));
    Role r;
    std::string error = ErrorOf([&] { r = CloudRoleMaker::FromEnv(c.env); });
    ASSERT_EQ(error, "");
    EXPECT_EQ(r.ToString(), c.role);
    EXPECT_EQ(r.num_nodes() * r.local_world_size, r.world_size);
    EXPECT_EQ(r.node_rank() * r.local_world_size + r.local_rank, r.rank);
  }
}

// ---------------------------------------------------------------------------------------------
// Environments that are refused, with the pieces the message must contain.

struct BadCase {
  const char* intent;
  Env env;
  std::vector<std::string> says;
};

Env Paddle(const std::string& id, const std::string& num, const std::string& endpoints) {
  Env env{{"PADDLE_TRAINER_ID", id}, {"PADDLE_TRAINERS_NUM", num}};
  if (!endpoints.empty()) env["PADDLE_TRAINER_ENDPOINTS"] = endpoints;
  return env;
}

Env With(Env env, const Env& more) {
  for (const auto& [k, v] : more) env[k] = v;
  return env;
}

const Env kTorch{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
const Env kLaunch = Paddle("1", "2", "10.0.0.1:6170,10.0.0.1:6171");

const std::vector<BadCase>& BadCases() {
  static const std::vector<BadCase> cases = {
      // Half-set conventions name the missing and the present variables.
      {"paddle without PADDLE_TRAINERS_NUM",
       {{"PADDLE_TRAINER_ID", "1"}},
       {"incomplete paddle", "missing PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID=1"}},
      {"paddle with only endpoints",
       {{"PADDLE_TRAINER_ENDPOINTS", "a:1,b:1"}},
       {"missing PADDLE_TRAINER_ID", "PADDLE_TRAINER_ENDPOINTS=a:1,b:1"}},
      {"paddle without PADDLE_TRAINERS_NUM: the id must be in the endpoints' range",
       {{"PADDLE_TRAINER_ID", "2"}, {"PADDLE_TRAINER_ENDPOINTS", "a:1,b:1"}},
       {"PADDLE_TRAINER_ID=2 is out of range", "PADDLE_TRAINERS_NUM=2"}},
      // Scheduler variables beside a launcher's that cannot describe the same job.
      {"mpirun with a RANK left in the environment: same world, other rank",
       {{"RANK", "0"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "1"},
        {"OMPI_COMM_WORLD_RANK", "1"},
        {"OMPI_COMM_WORLD_SIZE", "2"}},
       {"contradictory environment: RANK=0 and WORLD_SIZE=2 but OMPI_COMM_WORLD_RANK=1 and "
        "OMPI_COMM_WORLD_SIZE=2 (openmpi)"}},
      {"srun with a WORLD_SIZE that is no multiple of its tasks",
       {{"RANK", "0"},
        {"WORLD_SIZE", "3"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "1"},
        {"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "2"}},
       {"contradictory environment", "SLURM_NTASKS=2 (slurm)"}},
      {"paddle's id against OpenMPI's",
       With(kLaunch, {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
       {"PADDLE_TRAINER_ID=1 and PADDLE_TRAINERS_NUM=2 but OMPI_COMM_WORLD_RANK=0"}},
      {"paddle with 2 trainers and no endpoints",
       Paddle("0", "2", ""),
       {"missing PADDLE_TRAINER_ENDPOINTS", "PADDLE_TRAINERS_NUM=2", "PADDLE_TRAINER_ID=0"}},
      {"torchrun without WORLD_SIZE",
       {{"RANK", "1"}, {"LOCAL_RANK", "1"}},
       {"incomplete torchrun", "missing WORLD_SIZE", "RANK=1", "LOCAL_RANK=1"}},
      {"torchrun with LOCAL_RANK only",
       {{"LOCAL_RANK", "0"}},
       {"missing RANK, WORLD_SIZE", "LOCAL_RANK=0"}},
      {"torchrun with 2 ranks and no master",
       {{"RANK", "0"}, {"WORLD_SIZE", "2"}},
       {"missing MASTER_ADDR, MASTER_PORT", "RANK=0, WORLD_SIZE=2"}},
      {"torchrun with MASTER_ADDR but no MASTER_PORT",
       {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}},
       {"missing MASTER_PORT", "MASTER_ADDR=node0"}},
      {"openmpi without size",
       {{"OMPI_COMM_WORLD_RANK", "0"}},
       {"incomplete openmpi", "missing OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK=0"}},
      {"openmpi without master",
       {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
       {"missing MASTER_ADDR, MASTER_PORT", "OMPI_COMM_WORLD_SIZE=2"}},
      {"slurm task without SLURM_NTASKS",
       {{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}},
       {"incomplete slurm", "missing SLURM_NTASKS", "SLURM_PROCID=0", "SLURM_LOCALID=0"}},
      {"slurm without master (e.g. run directly in an sbatch script)",
       {{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_LOCALID", "0"},
        {"SLURM_TASKS_PER_NODE", "4"}},
       {"missing MASTER_ADDR, MASTER_PORT", "SLURM_NTASKS=4", "srun"}},
      // Malformed integers name the variable and the value.
      {"size with trailing garbage", Paddle("0", "2x", ""), {"PADDLE_TRAINERS_NUM='2x'"}},
      {"empty size", Paddle("0", "", ""), {"PADDLE_TRAINERS_NUM=''"}},
      {"negative size", Paddle("0", "-1", ""), {"PADDLE_TRAINERS_NUM=-1", "positive"}},
      {"zero size", Paddle("0", "0", ""), {"PADDLE_TRAINERS_NUM=0", "positive"}},
      {"plus sign", Paddle("+0", "1", ""), {"PADDLE_TRAINER_ID='+0'"}},
      {"space", With(kTorch, {{"RANK", " 1"}}), {"RANK=' 1'"}},
      {"huge",
       With(kTorch, {{"WORLD_SIZE", "99999999999"}}),
       {"WORLD_SIZE=99999999999", "too large"}},
      {"negative rank", Paddle("-1", "1", ""), {"PADDLE_TRAINER_ID=-1", "non-negative"}},
      {"bad local size", With(kTorch, {{"LOCAL_WORLD_SIZE", "two"}}), {"LOCAL_WORLD_SIZE='two'"}},
      {"slurm NTASKS garbage",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4a"}},
       {"SLURM_NTASKS='4a'"}},
      // Out of range.
      {"paddle rank == world",
       Paddle("2", "2", "a:1,a:2"),
       {"PADDLE_TRAINER_ID=2", "PADDLE_TRAINERS_NUM=2"}},
      {"torchrun rank == world", With(kTorch, {{"RANK", "2"}}), {"RANK=2", "WORLD_SIZE=2"}},
      {"local rank out of range",
       With(kTorch, {{"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
       {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"}},
      {"world not a multiple of local world",
       {{"RANK", "0"},
        {"WORLD_SIZE", "6"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "1"}},
       {"WORLD_SIZE=6", "LOCAL_WORLD_SIZE=4"}},
      {"local rank not rank % local world",
       {{"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"LOCAL_RANK", "0"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"MASTER_ADDR", "h"},
        {"MASTER_PORT", "1"}},
       {"LOCAL_RANK=0", "RANK=5", "LOCAL_WORLD_SIZE=4", "must be 1"}},
      {"LOCAL_RANK without a local size on a second node",
       With(kTorch, {{"LOCAL_RANK", "0"}}),
       {"LOCAL_RANK=0", "RANK=1", "WORLD_SIZE=2 (no local size set"}},
      {"slurm nodes with different task counts",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "5"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}},
       {"SLURM_TASKS_PER_NODE='2(x2),1'", "same number"}},
      {"slurm malformed tasks per node",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(2)"}},
       {"SLURM_TASKS_PER_NODE='2(2)'"}},
      {"slurm tasks-per-node variables disagree",
       {{"SLURM_PROCID", "0"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_NTASKS_PER_NODE", "4"},
        {"SLURM_TASKS_PER_NODE", "2(x2)"}},
       {"SLURM_NTASKS_PER_NODE=4", "SLURM_TASKS_PER_NODE=2(x2)"}},
      // Endpoints.
      {"endpoint count differs from PADDLE_TRAINERS_NUM",
       Paddle("0", "3", "a:1,a:2"),
       {"PADDLE_TRAINER_ENDPOINTS='a:1,a:2'", "2 endpoints", "world size is 3"}},
      {"endpoint without port", Paddle("0", "2", "a:1,b"), {"PADDLE_TRAINER_ENDPOINTS[1]='b'"}},
      {"endpoint port 0", Paddle("0", "2", "a:1,b:0"), {"PADDLE_TRAINER_ENDPOINTS[1]", "'0'"}},
      {"endpoint port too big",
       Paddle("0", "2", "a:1,b:65536"),
       {"PADDLE_TRAINER_ENDPOINTS[1]", "65536"}},
      {"endpoint port not a number",
       Paddle("0", "2", "a:1,b:x1"),
       {"PADDLE_TRAINER_ENDPOINTS[1]", "x1"}},
      {"empty endpoint", Paddle("0", "2", "a:1,"), {"PADDLE_TRAINER_ENDPOINTS[1]=''"}},
      {"empty host", Paddle("0", "2", "a:1,:2"), {"PADDLE_TRAINER_ENDPOINTS[1]=':2'"}},
      {"unbracketed IPv6", Paddle("0", "2", "a:1,::1:2"), {"PADDLE_TRAINER_ENDPOINTS[1]"}},
      {"duplicate endpoints", Paddle("0", "2", "a:1,a:1"), {"PADDLE_TRAINER_ENDPOINTS", "twice"}},
      {"a host's ranks not contiguous",
       Paddle("0", "4", "a:1,b:1,a:2,b:2"),
       {"PADDLE_TRAINER_ENDPOINTS", "host a", "not contiguous"}},
      {"hosts with different rank counts",
       Paddle("0", "4", "a:1,a:2,a:3,b:1"),
       {"PADDLE_TRAINER_ENDPOINTS", "host a runs 3", "host b runs 1"}},
      {"current endpoint differs from ENDPOINTS[rank]",
       With(kLaunch, {{"PADDLE_CURRENT_ENDPOINT", "10.0.0.1:6170"}}),
       {"PADDLE_CURRENT_ENDPOINT=10.0.0.1:6170", "PADDLE_TRAINER_ENDPOINTS[1]=10.0.0.1:6171"}},
      {"bad MASTER_PORT", With(kTorch, {{"MASTER_PORT", "0"}}), {"MASTER_PORT", "'0'"}},
      {"bad MASTER_ADDR", With(kTorch, {{"MASTER_ADDR", "a b"}}), {"MASTER_ADDR", "'a b'"}},
      // Paddle and torchrun both set but contradicting each other.
      {"RANK contradicts PADDLE_TRAINER_ID",
       With(kLaunch, {{"RANK", "0"}}),
       {"contradictory", "RANK=0", "PADDLE_TRAINER_ID=1"}},
      {"WORLD_SIZE contradicts PADDLE_TRAINERS_NUM",
       With(kLaunch, {{"WORLD_SIZE", "4"}}),
       {"contradictory", "WORLD_SIZE=4", "PADDLE_TRAINERS_NUM=2"}},
      {"LOCAL_RANK contradicts the endpoints",
       With(kLaunch, {{"LOCAL_RANK", "0"}}),
       {"LOCAL_RANK=0", "PADDLE_TRAINER_ENDPOINTS", "=1"}},
      {"LOCAL_WORLD_SIZE contradicts the endpoints",
       With(kLaunch, {{"LOCAL_WORLD_SIZE", "1"}}),
       {"LOCAL_WORLD_SIZE=1", "PADDLE_TRAINER_ENDPOINTS", "=2"}},
      {"MASTER_PORT contradicts ENDPOINTS[0]",
       With(kLaunch, {{"MASTER_PORT", "29500"}}),
       {"MASTER_PORT=29500", "PADDLE_TRAINER_ENDPOINTS[0]=6170"}},
      {"MASTER_ADDR contradicts ENDPOINTS[0]",
       With(kLaunch, {{"MASTER_ADDR", "10.0.0.9"}}),
       {"MASTER_ADDR=10.0.0.9", "PADDLE_TRAINER_ENDPOINTS[0]=10.0.0.1"}},
      {"malformed torchrun variable beside paddle", With(kLaunch, {{"RANK", "x"}}), {"RANK='x'"}},
      // GPUs.
      {"duplicate GPUs",
       {{"FLAGS_selected_gpus", "0,0"}},
       {"FLAGS_selected_gpus='0,0'", "twice", "one GPU per rank"}},
      {"malformed GPU id", {{"FLAGS_selected_gpus", "0,x"}}, {"FLAGS_selected_gpus='0,x'", "'x'"}},
      {"empty GPU entry", {{"FLAGS_selected_gpus", "0,"}}, {"FLAGS_selected_gpus='0,'"}},
      {"negative GPU id", {{"FLAGS_selected_gpus", "-1"}}, {"FLAGS_selected_gpus='-1'"}},
  };
  return cases;
}

TEST(CloudRoleMaker, RefusesBadEnvironmentsNamingTheVariables) {
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(std::string(c.intent) + " | " + Print(c.env));
    std::string error = ErrorOf([&] { CloudRoleMaker::FromEnv(c.env); });
    ASSERT_NE(error, "") << "accepted";
    for (const auto& piece : c.says)
      EXPECT_NE(error.find(piece), std::string::npos) << "missing '" << piece << "' in: " << error;
  }
}

TEST(CloudRoleMaker, DerivesLocalRanksFromPaddleEndpointsAcrossTwoHosts) {
  const std::vector<std::string> eps = {"10.0.0.1:6170", "10.0.0.1:6171", "10.0.0.1:6172",
                                        "10.0.0.2:6170", "10.0.0.2:6171", "10.0.0.2:6172"};
  std::string list;
  for (const auto& e : eps) list += (list.empty() ? "" : ",") + e;
  for (int rank = 0; rank < 6; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    Role r = CloudRoleMaker::FromEnv(
        With(Paddle(std::to_string(rank), "6", list), {{"PADDLE_CURRENT_ENDPOINT", eps[rank]}}));
    EXPECT_EQ(r.local_rank, rank % 3);
    EXPECT_EQ(r.local_world_size, 3);
    EXPECT_EQ(r.node_rank(), rank / 3);
    EXPECT_EQ(r.num_nodes(), 2);
    EXPECT_EQ(r.endpoints, eps);
    EXPECT_EQ(r.current_endpoint, eps[rank]);
    EXPECT_EQ(r.master_addr, "10.0.0.1");
    EXPECT_EQ(r.master_port, 6170);
  }
}

// Parameter-server mode reads Paddle's parameter-server variables: servers are ranks 0..S-1 (by
// their place in PADDLE_PSERVERS_IP_PORT_LIST), trainers follow; the store is on server 0.
TEST(CloudRoleMaker, ParameterServerRolesFromPaddlesVariables) {
  const Env common = {{"PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:6001,127.0.0.1:6002"},
                      {"PADDLE_TRAINERS_NUM", "3"}};
  Env server = common;
  server["TRAINING_ROLE"] = "PSERVER";
  server["POD_IP"] = "127.0.0.1";
  server["PADDLE_PORT"] = "6002";
  Role r = CloudRoleMaker::FromPsEnv(server);
  EXPECT_TRUE(r.is_ps());
  EXPECT_TRUE(r.is_server());
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 5);
  EXPECT_EQ(r.server_num, 2);
  EXPECT_EQ(r.trainer_num, 3);
  EXPECT_EQ(r.store_endpoint(), "127.0.0.1:6001");
  Env trainer = common;
  trainer["TRAINING_ROLE"] = "TRAINER";
  trainer["PADDLE_TRAINER_ID"] = "2";
  r = CloudRoleMaker::FromPsEnv(trainer);
  EXPECT_FALSE(r.is_server());
  EXPECT_EQ(r.rank, 4);
  EXPECT_EQ(r.trainer_id(), 2);
  // Refusals name the variable.
  Env bad = server;
  bad["PADDLE_PORT"] = "7000";
  EXPECT_NE(
      ErrorOf([&] { CloudRoleMaker::FromPsEnv(bad); }).find("not in PADDLE_PSERVERS_IP_PORT_LIST"),
      std::string::npos);
  bad = trainer;
  bad["TRAINING_ROLE"] = "HETER_TRAINER";
  EXPECT_NE(ErrorOf([&] { CloudRoleMaker::FromPsEnv(bad); }).find("TRAINING_ROLE=HETER_TRAINER"),
            std::string::npos);
  bad = trainer;
  bad["PADDLE_TRAINER_ID"] = "3";
  EXPECT_NE(ErrorOf([&] { CloudRoleMaker::FromPsEnv(bad); }).find("PADDLE_TRAINER_ID=3"),
            std::string::npos);
  bad = trainer;
  bad.erase("PADDLE_PSERVERS_IP_PORT_LIST");
  EXPECT_NE(ErrorOf([&] { CloudRoleMaker::FromPsEnv(bad); }).find("PADDLE_PSERVERS_IP_PORT_LIST"),
            std::string::npos);
}

TEST(CloudRoleMaker, GenerateReadsTheProcessEnvironment) {
  for (const char* name : {"PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS",
                           "PADDLE_CURRENT_ENDPOINT", "FLAGS_selected_gpus", "RANK", "WORLD_SIZE",
                           "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    unsetenv(name);
  }
  setenv("PADDLE_TRAINER_ID", "1", 1);
  setenv("PADDLE_TRAINERS_NUM", "2", 1);
  setenv("PADDLE_TRAINER_ENDPOINTS", "127.0.0.1:6170,127.0.0.1:6171", 1);
  setenv("FLAGS_selected_gpus", "1", 1);
  Role r = CloudRoleMaker().Generate();
  EXPECT_EQ(r.source, "paddle");
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 2);
  EXPECT_EQ(r.current_endpoint, "127.0.0.1:6171");
  EXPECT_EQ(r.selected_gpus, std::vector<int>{1});
  setenv("RANK", "0", 1);
  std::string e = ErrorOf([] { CloudRoleMaker().Generate(); });
  EXPECT_NE(e.find("RANK=0"), std::string::npos) << e;
  EXPECT_NE(e.find("PADDLE_TRAINER_ID=1"), std::string::npos) << e;
}

// `keel train --selected_gpus=1` (a flag, not the environment variable) picks the GPU too.
TEST(CloudRoleMaker, GenerateReadsTheSelectedGpusFlag) {
  gflags::FlagSaver saver;
  for (const char* name : {"PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ENDPOINTS",
                           "PADDLE_CURRENT_ENDPOINT", "FLAGS_selected_gpus", "RANK", "WORLD_SIZE",
                           "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    unsetenv(name);
  }
  EXPECT_TRUE(CloudRoleMaker().Generate().selected_gpus.empty());
  ASSERT_FALSE(gflags::SetCommandLineOption("selected_gpus", "1").empty());
  EXPECT_EQ(CloudRoleMaker().Generate().selected_gpus, std::vector<int>{1});
  // The flag wins over the environment variable, as a command line does.
  setenv("FLAGS_selected_gpus", "0", 1);
  EXPECT_EQ(CloudRoleMaker().Generate().selected_gpus, std::vector<int>{1});
  unsetenv("FLAGS_selected_gpus");
}

TEST(Role, ToStringIsOneLineWithTheFacts) {
  Role r = CloudRoleMaker::FromEnv(
      With(Paddle("3", "4", kFourOnTwoHosts), {{"FLAGS_selected_gpus", "1"}}));
  EXPECT_EQ(r.ToString(),
            "rank 3/4 local 1/2 node 1/2 source=paddle store=10.0.0.1:6170 "
            "endpoint=10.0.0.2:6171 gpus=1");
  EXPECT_EQ(Role().ToString(),
            "rank 0/1 local 0/1 node 0/1 source=none store=127.0.0.1:0 gpus=none");
}

// ---------------------------------------------------------------------------------------------
// UserDefinedRoleMaker.

TEST(UserDefinedRoleMaker, DerivesFromEndpointsLikePaddle) {
  Role r = UserDefinedRoleMaker(2, 4, {"a:1", "a:2", "b:1", "b:2"}).Generate();
  EXPECT_EQ(r.source, "user");
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.local_rank, 0);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.store_endpoint(), "a:1");
  EXPECT_EQ(r.current_endpoint, "b:1");

  Role single = UserDefinedRoleMaker(0, 1).Generate();
  EXPECT_EQ(single.world_size, 1);
  EXPECT_EQ(single.source, "user");
}

TEST(UserDefinedRoleMaker, TakesAFullRole) {
  Role given;
  given.rank = 3;
  given.world_size = 4;
  given.local_rank = 1;
  given.local_world_size = 2;
  given.master_addr = "node0";
  given.master_port = 29500;
  given.selected_gpus = {1};
  Role r = UserDefinedRoleMaker(given).Generate();
  EXPECT_EQ(r.source, "user");
  EXPECT_EQ(r.store_endpoint(), "node0:29500");
  EXPECT_EQ(r.node_rank(), 1);

  Role with_endpoints;
  with_endpoints.rank = 1;
  with_endpoints.world_size = 2;
  with_endpoints.endpoints = {"h:1", "h:2"};
  r = UserDefinedRoleMaker(with_endpoints).Generate();
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_world_size, 2);
  EXPECT_EQ(r.store_endpoint(), "h:1");
  EXPECT_EQ(r.current_endpoint, "h:2");
}

TEST(UserDefinedRoleMaker, RefusesInconsistentRoles) {
  struct Case {
    const char* intent;
    std::function<void()> make;
    std::string says;
  };
  auto role = [](std::function<void(Role*)> edit) {
    Role r;
    r.rank = 1;
    r.world_size = 2;
    r.local_rank = 1;
    r.local_world_size = 2;
    r.master_port = 6170;
    edit(&r);
    return r;
  };
  const std::vector<Case> cases = {
      {"rank out of range",
       [] {
         UserDefinedRoleMaker(2, 2, {"a:1", "a:2"});
       },
       "rank=2"},
      {"world 0", [] { UserDefinedRoleMaker(0, 0); }, "world_size=0"},
      {"world 2 without endpoints", [] { UserDefinedRoleMaker(0, 2); }, "needs endpoints"},
      {"endpoint count",
       [] {
         UserDefinedRoleMaker(0, 3, {"a:1", "a:2"});
       },
       "2 endpoints"},
      {"bad endpoint",
       [] {
         UserDefinedRoleMaker(0, 2, {"a:1", "a"});
       },
       "endpoints[1]='a'"},
      {"no master port", [&] { UserDefinedRoleMaker(role([](Role* r) { r->master_port = 0; })); },
       "master_port=0"},
      {"local world not dividing",
       [&] { UserDefinedRoleMaker(role([](Role* r) { r->local_world_size = 3; })); },
       "local_world_size=3"},
      {"local rank not rank % local world",
       [&] { UserDefinedRoleMaker(role([](Role* r) { r->local_rank = 0; })); },
       "local_rank=0 does not match rank=1"},
      {"duplicate gpus",
       [&] { UserDefinedRoleMaker(role([](Role* r) {
               r->selected_gpus = {0, 0};
             })); },
       "selected_gpus has 0 twice"},
      {"master differs from endpoints[0]",
       [&] { UserDefinedRoleMaker(role([](Role* r) {
               r->endpoints = {"h:1", "h:2"};
             })); },
       "master h:1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.intent);
    std::string e = ErrorOf(c.make);
    EXPECT_NE(e.find(c.says), std::string::npos) << e;
    EXPECT_NE(e.find("UserDefinedRoleMaker"), std::string::npos) << e;
  }
}

}  // namespace
}  // namespace fleet
}  // namespace keel
