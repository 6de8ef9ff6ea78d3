// DataLoader: turns a Dataset into this rank's batches for one epoch at a time.
//
//   epoch order  0..N-1, or a permutation drawn from mt19937_64(seed + epoch) when shuffling
//                (the same on every rank and every standard library; seed must match across ranks)
//   sharding     rank r takes positions r, r + nranks, r + 2 nranks, ... of the epoch order, so
//                shards are disjoint and every rank gets samples_per_rank() samples:
//                  drop_last: floor(N / nranks); the order's last N mod nranks samples are
//                             dropped (different ones each epoch when shuffling), and so is a
//                             last partial batch: every batch is full and no sample repeats.
//                  otherwise: ceil(N / nranks), padding by wrapping around to the start of the
//                             order (as PyTorch's DistributedSampler does), so up to nranks - 1
//                             samples appear twice in an epoch; the last batch may be short.
//                  even_shards = false (evaluation): neither padding nor dropping; rank r takes
//                             the positions r + k nranks < N, so every sample is seen exactly
//                             once in the job and shard sizes differ by at most one.
//   batches      examples stacked into [B, ...] tensors, keyed by Dataset::names()
//   prefetch     num_workers threads assemble batches ahead of the consumer, at most
//                queue_capacity batches (ready or in assembly) ahead; batches are delivered in
//                the epoch order whatever the number of workers. num_workers = 0: Next
//                assembles each batch itself.
//
// A dataset error (thrown by Get, in a worker or not) comes out of the Next that would have
// returned its batch, as a keel::Error naming the epoch, rank and batch; after it the epoch is
// failed and Next rethrows it until StartEpoch. Use from one consumer thread. The destructor
// stops and joins the workers at any point, mid-epoch included.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "framework/data/dataset.h"
#include "framework/runtime/tensor.h"

namespace keel {

// The same type as executor/executor.h's FeedMap: a loader's batch feeds Executor::Run as is.
using FeedMap = std::map<std::string, Tensor>;

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;  // epoch e shuffles with seed + e
  bool drop_last = false;
  int num_workers = 0;     // prefetch threads; 0: synchronous
  int queue_capacity = 4;  // batches ready or in assembly ahead of the consumer, >= 1
  int rank = 0;
  int nranks = 1;
  bool even_shards = true;  // false: no padding, uneven shards (needs drop_last = false)
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Begins `epoch` (>= 0), abandoning what is left of the current one. Next before any
  // StartEpoch begins epoch 0.
  void StartEpoch(int64_t epoch);
  // The epoch's next batch; false at the epoch's end (and on every later call until StartEpoch).
  // `indices`, when given, receives the batch's dataset indices in row order.
  bool Next(FeedMap* batch, std::vector<int64_t>* indices = nullptr);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // Samples this rank sees per epoch, padding included; the same on every rank unless
  // even_shards is false.
  int64_t samples_per_rank() const { return samples_per_rank_; }
  const std::vector<std::string>& names() const { return names_; }
  const LoaderOptions& options() const { return options_; }
  // This rank's dataset indices for `epoch`, in delivery order.
  std::vector<int64_t> EpochIndices(int64_t epoch) const;

 private:
  struct Assembled {
    FeedMap batch;
    std::exception_ptr error;
  };

  void WorkerLoop();
  void StartEpochLocked(int64_t epoch, std::shared_ptr<const std::vector<int64_t>> order);
  // Stacks the examples of batch `b` of `order`.
  FeedMap Assemble(const std::vector<int64_t>& order, int64_t b) const;
  // A keel::Error with the loader's context around what `error` says.
  std::exception_ptr WrapError(std::exception_ptr error, int64_t epoch, int64_t b) const;

  const std::shared_ptr<const Dataset> dataset_;
  const LoaderOptions options_;
  std::vector<std::string> names_;
  int64_t dataset_size_ = 0;
  int64_t samples_per_rank_ = 0;
  int64_t batches_per_epoch_ = 0;

  // Shared with the workers, under mu_. A batch b is claimed by one worker when
  // next_claim_ <= b < next_deliver_ + queue_capacity, and its result kept only if the epoch
  // (generation_) has not changed meanwhile.
  std::mutex mu_;
  std::condition_variable work_cv_;   // workers: there is a batch to claim, or stop
  std::condition_variable ready_cv_;  // consumer: a batch was assembled
  bool stop_ = false;
  bool started_ = false;
  int64_t epoch_ = 0;
  uint64_t generation_ = 0;
  std::shared_ptr<const std::vector<int64_t>> order_;
  int64_t next_claim_ = 0;
  int64_t next_deliver_ = 0;
  std::map<int64_t, Assembled> ready_;
  std::exception_ptr failed_;
  std::vector<std::thread> workers_;
};

}  // namespace keel
