// AlgoCache: what a library's algorithm search found, kept per problem shape so the search runs
// once per shape for the life of the process (cuDNN's convolution algorithms; the search costs
// milliseconds to seconds, a step microseconds). Plain C++ so CPU tests cover the bookkeeping.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace keel {

// Key: the integers that decide the choice (device, dtype, math mode, every dim and attribute).
using AlgoKey = std::vector<int64_t>;

template <typename Choice>
class AlgoCache {
 public:
  // The cached choice for `key`, or search() run now (once per key, even under concurrent callers)
  // and remembered. A search that throws caches nothing.
  Choice GetOrSearch(const AlgoKey& key, const std::function<Choice()>& search) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    Choice c = search();
    ++searches_;
    cache_.emplace(key, c);
    return c;
  }
  int64_t searches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return searches_;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.size();
  }

 private:
  mutable std::mutex mu_;
  std::map<AlgoKey, Choice> cache_;
  int64_t searches_ = 0;
};

}  // namespace keel
