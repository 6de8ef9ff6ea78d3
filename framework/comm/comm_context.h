// CommContext: this process's place in the job (rank, world, the store) once fleet::init has run.
// Collective ops reach the store and rings through it; rank 0 also serves the store from here,
// unless keel launch serves it.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "framework/comm/communicator.h"
#include "framework/comm/store.h"

namespace keel {

struct CommConfig {
  int rank = 0;
  int nranks = 1;
  std::string store_host = "127.0.0.1";  // rank 0's address: the store is served there
  int store_port = 0;
  std::string my_host = "127.0.0.1";  // the address peers reach this rank at
  std::string token = "keel";         // the job token every rank must present
  int64_t generation = 0;             // restart round (KEEL_RESTART_COUNT), see store.h
  // Rank 0 serves the store on every interface even when store_host is a loopback name: ranks
  // on other nodes reach it by another address (a Kubernetes master pod sees itself as localhost).
  bool store_listen_all = false;
  std::chrono::milliseconds timeout{300000};  // store, setup and every collective
};

class CommContext {
 public:
  static CommContext& Get();

  // Starts the store server on rank 0 (unless keel launch serves it) and connects every rank to
  // it. Idempotent for an equal config; re-initializing with another config is an error.
  void Init(const CommConfig& config);
  bool initialized() const { return client_ != nullptr; }
  const CommConfig& config() const { return config_; }
  // The timeout of rings created from now on: their setup and every collective on them
  // (DistributedStrategy::comm_timeout_s, set by fleet's minimize). Must be positive.
  void SetTimeout(std::chrono::milliseconds timeout);
  // The store client; a keel::Error when Init has not run ("call fleet::init first").
  StoreClient& store(const std::string& user);

  // Creates ring `ring_id` of `nranks` ranks, this process being `rank` in it, and registers it.
  // `group` names which ranks meet (e.g. "node1" for an intra-node ring): rings with one id but
  // different groups rendezvous apart. Empty: the ring spans the job. `name` is how errors and
  // the collective watch call the ring (empty: "ring <id>"). The setup's waits are watched
  // (collective_watch.h) as the ring's collective #0. `host_staged`: a CUDA ring through pinned
  // host memory whatever --gpu_comm_backend says (never NCCL).
  void CreateRing(int ring_id, int nranks, int rank, bool cuda, int device,
                  const std::string& group = "", const std::string& name = "",
                  bool host_staged = false);

  // Drops rings, the client and the server (tests).
  void Reset();

 private:
  // CreateRing's work: the ring, named `name` on the watch's `channel`.
  std::shared_ptr<Communicator> Connect(int ring_id, int nranks, int rank, bool cuda, int device,
                                        const std::string& group, const std::string& name,
                                        const std::string& channel, bool host_staged);

  CommConfig config_;
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> client_;
};

}  // namespace keel
