// GlooStoreAdapter: Gloo's rendezvous store on keel's store client, keys under a prefix, every
// wait bounded by the comm timeout. The collective Gloo rings (gloo_communicator.cc) and the
// parameter-server transport (framework/ps/ps_transport.cc) meet through it.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "framework/comm/store.h"

namespace keel {

class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(StoreClient& store, std::string prefix, std::chrono::milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.Set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = store_.Get(prefix_ + key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    std::vector<std::string> full;
    for (auto& k : keys) full.push_back(prefix_ + k);
    store_.Wait(full, t);
  }

 private:
  StoreClient& store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace keel
