// Role makers: who this worker is (rank, world, node-local rank, rendezvous endpoint, GPUs).
//
// CloudRoleMaker reads the environment a launcher or scheduler left (docs/architecture.md,
// "Roles");
// UserDefinedRoleMaker takes the same facts from code. Both hand out a Role that satisfies:
//   0 <= rank < world_size, 0 <= local_rank < local_world_size, world_size % local_world_size == 0,
//   local_rank == rank % local_world_size (the ranks of one node are contiguous), endpoints empty
//   or one distinct "host:port" per rank, master_port in 1..65535 when world_size > 1.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fleet/role.h"

namespace keel {
namespace fleet {

class RoleMaker {
 public:
  virtual ~RoleMaker() = default;
  virtual Role Generate() const = 0;
};

// Reads, in this order, the first convention that has any of its variables set:
//   paddle    PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM (when absent, as in Paddle, the number of
//             ENDPOINTS), PADDLE_TRAINER_ENDPOINTS (required when TRAINERS_NUM > 1; the store is
//             on ENDPOINTS[0]), PADDLE_CURRENT_ENDPOINT (optional,
//             must equal ENDPOINTS[rank]); local rank/size come from the ranks sharing this
//             rank's host in ENDPOINTS.
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (also Kubeflow PyTorchJob);
//             MASTER_ADDR and MASTER_PORT required when WORLD_SIZE > 1.
//   openmpi   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; MASTER_ADDR/PORT as above.
//   slurm     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
//             SLURM_TASKS_PER_NODE ("4(x2)"); MASTER_ADDR/PORT as above.
// Rank and world size are required; an absent local rank/size means one node (local = global;
// a Kubeflow pod running one worker should set LOCAL_RANK=0 LOCAL_WORLD_SIZE=1).
// MASTER_ADDR/MASTER_PORT are rendezvous variables, not a convention of their own.
// FLAGS_selected_gpus ("0,1"; or the --selected_gpus flag when given, which wins) is read
// whatever the source; "" or unset means none.
// Paddle and torchrun are launcher conventions: when both are set (keel launch sets both) every
// torchrun variable present must agree with Paddle's (rank, world, local rank/size, master).
// OpenMPI and Slurm are scheduler conventions, read only when no launcher convention is set:
// under `srun torchrun` or `mpirun keel launch` they describe the per-node launcher, not this
// worker; then the launcher's world must be a multiple of the scheduler's, and when the two are
// equal (a worker per task) the ranks must agree: otherwise the environment is contradictory
// (e.g. a RANK left over in an mpirun job). Malformed, half-set or contradictory variables throw
// keel::Error naming them.
//
// With is_collective=false (parameter-server mode, docs/parameter-server.md) it reads Paddle's
// parameter-server variables instead: TRAINING_ROLE (TRAINER or PSERVER),
// PADDLE_PSERVERS_IP_PORT_LIST (every server's ip:port; the store is on the first),
// PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ID (a trainer's id), POD_IP and PADDLE_PORT (a server's
// endpoint, which must be in the list), PADDLE_TRAINER_ENDPOINTS (optional, one per trainer).
class CloudRoleMaker : public RoleMaker {
 public:
  explicit CloudRoleMaker(bool is_collective = true);
  Role Generate() const override;                                      // reads the real environment
  static Role FromEnv(const std::map<std::string, std::string>& env);  // testable core
  static Role FromPsEnv(const std::map<std::string, std::string>& env);

 private:
  bool is_collective_;
};

// The role given in code, like Paddle's UserDefinedCollectiveRoleMaker. Validated on
// construction with the same rules as the environment; source is "user".
class UserDefinedRoleMaker : public RoleMaker {
 public:
  // endpoints: empty, or one "host:port" per rank; the store is on endpoints[0] and the local
  // rank/size derive from the hosts, as for Paddle. With world_size > 1 and no endpoints, use the
  // Role overload to give master_addr/master_port.
  UserDefinedRoleMaker(int rank, int world_size, std::vector<std::string> endpoints = {});
  // Full control (source is set to "user"). With endpoints, current_endpoint, master and local
  // rank/size left at their defaults are derived from them; given values must agree.
  explicit UserDefinedRoleMaker(Role role);
  Role Generate() const override { return role_; }

 private:
  Role role_;
};

}  // namespace fleet
}  // namespace keel
