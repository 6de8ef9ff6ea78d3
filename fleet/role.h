// Role: who this worker is in the job (rank, world, node-local rank, rendezvous endpoint, GPUs),
// as a role maker (fleet/role_maker.h) found it. Plain data, in its own header so that the
// strategy and the transpile options can name it without the role makers.
#pragma once

#include <string>
#include <vector>

namespace keel {
namespace fleet {

struct Role {
  int rank = 0, world_size = 1;  // global
  int local_rank = 0, local_world_size = 1;
  std::vector<std::string> endpoints;     // "ip:port" per rank when known (Paddle), else empty
  std::string current_endpoint;           // this rank's, when known
  std::string master_addr = "127.0.0.1";  // where rank 0 serves the rendezvous store
  int master_port = 0;                    // 0: none (a single worker needs no store)
  std::vector<int> selected_gpus;         // from FLAGS_selected_gpus ("0,1" -> {0,1}); empty on CPU
  std::string source = "none";  // "paddle" | "torchrun" | "openmpi" | "slurm" | "none" | "user"

  // Parameter-server mode (CloudRoleMaker(is_collective=false), docs/parameter-server.md):
  // "TRAINER" or "PSERVER" (Paddle's TRAINING_ROLE); empty in a collective job. rank and
  // world_size then number every process of the job, servers first: server i is rank i, trainer
  // j is rank server_num + j; the store is on server 0's endpoint.
  std::string training_role;
  int server_num = 0, trainer_num = 0;
  std::vector<std::string> server_endpoints;  // PADDLE_PSERVERS_IP_PORT_LIST

  bool is_ps() const { return !training_role.empty(); }
  bool is_server() const { return training_role == "PSERVER"; }
  // This trainer's id (0..trainer_num-1); in collective mode the rank.
  int trainer_id() const { return is_ps() ? rank - server_num : rank; }

  int num_nodes() const { return world_size / local_world_size; }
  int node_rank() const { return rank / local_world_size; }
  std::string store_endpoint() const;  // master_addr + ":" + master_port
  std::string ToString() const;        // one line for logs
};

}  // namespace fleet
}  // namespace keel
