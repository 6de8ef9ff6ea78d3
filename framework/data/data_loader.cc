#include "framework/data/data_loader.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "framework/error.h"

namespace keel {
namespace {

// Uniform in [0, bound) by rejection: unbiased, and unlike std::uniform_int_distribution the same
// on every standard library, so a (seed, epoch) names one order everywhere.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  const uint64_t limit = max - max % bound;  // a multiple of bound
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  KEEL_ENFORCE(dataset_ != nullptr, "DataLoader: no dataset");
  KEEL_ENFORCE(options_.batch_size >= 1, "DataLoader: batch_size ", options_.batch_size,
               ", want >= 1");
  KEEL_ENFORCE(options_.nranks >= 1 && 0 <= options_.rank && options_.rank < options_.nranks,
               "DataLoader: rank ", options_.rank, " outside [0, nranks = ", options_.nranks, ")");
  KEEL_ENFORCE(options_.num_workers >= 0, "DataLoader: num_workers ", options_.num_workers,
               ", want >= 0");
  KEEL_ENFORCE(options_.queue_capacity >= 1, "DataLoader: queue_capacity ", options_.queue_capacity,
               ", want >= 1");
  names_ = dataset_->names();
  KEEL_ENFORCE(!names_.empty(), "DataLoader: the dataset names no fields");
  KEEL_ENFORCE(std::set<std::string>(names_.begin(), names_.end()).size() == names_.size(),
               "DataLoader: the dataset's field names repeat");
  dataset_size_ = dataset_->size();
  KEEL_ENFORCE(dataset_size_ >= 0, "DataLoader: dataset size ", dataset_size_);

  KEEL_ENFORCE(options_.even_shards || !options_.drop_last,
               "DataLoader: even_shards = false (every sample once) and drop_last = true "
               "contradict each other");
  const int64_t n = dataset_size_, r = options_.nranks, b = options_.batch_size;
  if (!options_.even_shards) {
    samples_per_rank_ = n > options_.rank ? (n - options_.rank + r - 1) / r : 0;
  } else {
    samples_per_rank_ = options_.drop_last ? n / r : (n + r - 1) / r;
  }
  batches_per_epoch_ = options_.drop_last ? samples_per_rank_ / b : (samples_per_rank_ + b - 1) / b;

  for (int i = 0; i < options_.num_workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

std::vector<int64_t> DataLoader::EpochIndices(int64_t epoch) const {
  const int64_t n = dataset_size_;
  std::vector<int64_t> perm(n);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (options_.shuffle && n > 1) {
    std::mt19937_64 rng(options_.seed + static_cast<uint64_t>(epoch));
    for (int64_t i = n - 1; i > 0; --i) {
      std::swap(perm[i], perm[UniformBelow(rng, static_cast<uint64_t>(i) + 1)]);
    }
  }
  // Rank r takes positions r, r + nranks, ...; positions past n wrap around (padding).
  std::vector<int64_t> mine(samples_per_rank_);
  for (int64_t k = 0; k < samples_per_rank_; ++k) {
    mine[k] = perm[(options_.rank + k * options_.nranks) % n];
  }
  return mine;
}

void DataLoader::StartEpoch(int64_t epoch) {
  KEEL_ENFORCE(epoch >= 0, "DataLoader::StartEpoch: epoch ", epoch, ", want >= 0");
  auto order = std::make_shared<const std::vector<int64_t>>(EpochIndices(epoch));
  {
    std::lock_guard<std::mutex> lock(mu_);
    StartEpochLocked(epoch, std::move(order));
  }
  work_cv_.notify_all();
}

void DataLoader::StartEpochLocked(int64_t epoch,
                                  std::shared_ptr<const std::vector<int64_t>> order) {
  ++generation_;  // batches of the old epoch still in assembly are discarded when done
  epoch_ = epoch;
  order_ = std::move(order);
  next_claim_ = next_deliver_ = 0;
  ready_.clear();
  failed_ = nullptr;
  started_ = true;
}

bool DataLoader::Next(FeedMap* batch, std::vector<int64_t>* indices) {
  CHECK(batch != nullptr);
  if (!started_) StartEpoch(0);
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_) std::rethrow_exception(failed_);
  if (next_deliver_ >= batches_per_epoch_) return false;
  const int64_t b = next_deliver_++;
  if (indices) {
    const int64_t begin = b * options_.batch_size;
    const int64_t end = std::min(begin + options_.batch_size, samples_per_rank_);
    indices->assign(order_->begin() + begin, order_->begin() + end);
  }

  if (workers_.empty()) {
    lock.unlock();  // nothing else touches the state without workers
    try {
      *batch = Assemble(*order_, b);
    } catch (...) {
      failed_ = WrapError(std::current_exception(), epoch_, b);
      std::rethrow_exception(failed_);
    }
    return true;
  }

  work_cv_.notify_one();  // the window moved: one more batch may be claimed
  ready_cv_.wait(lock, [&] { return ready_.count(b) > 0; });
  Assembled done = std::move(ready_.at(b));
  ready_.erase(b);
  if (done.error) {
    failed_ = WrapError(done.error, epoch_, b);
    std::rethrow_exception(failed_);
  }
  *batch = std::move(done.batch);
  return true;
}

void DataLoader::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stop_ || (order_ != nullptr && next_claim_ < batches_per_epoch_ &&
                       next_claim_ < next_deliver_ + options_.queue_capacity);
    });
    if (stop_) return;
    const int64_t b = next_claim_++;
    const uint64_t generation = generation_;
    std::shared_ptr<const std::vector<int64_t>> order = order_;
    lock.unlock();

    Assembled done;
    try {
      done.batch = Assemble(*order, b);
    } catch (...) {
      done.error = std::current_exception();
    }

    lock.lock();
    if (generation == generation_) {
      ready_.emplace(b, std::move(done));
      ready_cv_.notify_one();
    }
  }
}

FeedMap DataLoader::Assemble(const std::vector<int64_t>& order, int64_t b) const {
  const int64_t begin = b * options_.batch_size;
  const int64_t count = std::min(options_.batch_size, samples_per_rank_ - begin);
  const size_t nfields = names_.size();
  std::vector<Tensor> stacked(nfields);
  std::vector<size_t> field_bytes(nfields);
  std::vector<DDim> field_dims(nfields);
  for (int64_t j = 0; j < count; ++j) {
    const int64_t index = order[begin + j];
    Example ex = dataset_->Get(index);
    KEEL_ENFORCE(ex.size() == nfields, "example ", index, " has ", ex.size(),
                 " fields; the dataset names ", nfields);
    for (size_t k = 0; k < nfields; ++k) {
      const Tensor& t = ex[k];
      KEEL_ENFORCE(t.initialized() && t.place().is_cpu(), "example ", index, " field '", names_[k],
                   "' is not an initialized CPU tensor");
      if (j == 0) {
        field_dims[k] = t.dims();
        DDim dims;
        dims.push_back(count);
        for (int64_t d : t.dims()) dims.push_back(d);
        stacked[k] = Tensor(t.dtype(), dims);
        field_bytes[k] = t.nbytes();
      } else {
        KEEL_ENFORCE(t.dtype() == stacked[k].dtype() && t.dims() == field_dims[k], "example ",
                     index, " field '", names_[k], "' is ", DTypeName(t.dtype()), t.dims().str(),
                     " but example ", order[begin], "'s is ", DTypeName(stacked[k].dtype()),
                     field_dims[k].str(), ": a batch stacks equal shapes");
      }
      std::memcpy(static_cast<char*>(stacked[k].raw_data()) + j * field_bytes[k], t.raw_data(),
                  field_bytes[k]);
    }
  }
  FeedMap batch;
  for (size_t k = 0; k < nfields; ++k) batch.emplace(names_[k], std::move(stacked[k]));
  return batch;
}

std::exception_ptr DataLoader::WrapError(std::exception_ptr error, int64_t epoch, int64_t b) const {
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  return std::make_exception_ptr(
      Error(StrCat("DataLoader (epoch ", epoch, ", rank ", options_.rank, " of ", options_.nranks,
                   ", batch ", b, " of ", batches_per_epoch_, "): ", what)));
}

}  // namespace keel
