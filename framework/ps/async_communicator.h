// A trainer's asynchronous communicator (Paddle's AsyncCommunicator; docs/parameter-server.md,
// "Asynchronous mode"): in async mode the trainer's `send` ops hand their gradient blocks to it,
// `send_barrier` queues the step's blocks, and a thread of its own pushes them to the servers and
// pulls the parameters back, while the trainer goes on with its next step. `recv` (at the start
// of a step, after the ops that need no parameter, such as a distributed table's lookups) takes
// the latest parameters pulled, first waiting, with max_staleness = 0 (keel's default), for the
// pull that follows the trainer's previous step; Paddle's communicator never waits (max_staleness
// -1), and its trainers compute on parameters that lack their own latest steps.
//
// Merging: when several steps wait in the queue, the thread pushes up to max_merge_var_num of
// them as one step, each block merged over those steps: summed when its parameter's update is SGD
// (the sum of the steps' updates), else averaged (Paddle's rule). Row-sparse blocks merge row by
// row (the union of the rows, each summed in queue order). One push is one server step: a header,
// the blocks (as the synchronous path sends them), then every parameter block back.
//
// Errors of the thread (a dead server, a timeout) are kept and thrown by the trainer's next call.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "framework/runtime/dtype.h"

namespace keel {
namespace ps {

class Transport;

class AsyncCommunicator {
 public:
  explicit AsyncCommunicator(Transport* t);
  ~AsyncCommunicator();

  // One gradient block of the step being built: dense bytes, or rows (sorted, distinct, numbered
  // as the server wants them) with their values, `width` elements each. `sum`: merge by sum.
  void AddDense(int server, int slot, DType dtype, const void* data, size_t bytes, bool sum,
                const std::string& what);
  void AddRows(int server, int slot, DType dtype, std::vector<int64_t> rows, const void* values,
               int64_t width, bool sum, const std::string& what);
  // The step's blocks are complete (send_barrier): queues them; waits while the queue is full.
  void Submit();
  // A parameter block to pull after every push (the recv ops of the trainer's startup register
  // them, with `initial`: where its initial value lands once their fetch_barrier has waited; read
  // by Start), and its latest value into `dst` (`bytes`).
  void AddPull(int server, int slot, size_t bytes, const std::string& what,
               const void* initial = nullptr);
  // Waits until the pulls hold every step this trainer submitted but its `max_staleness` latest
  // (max_staleness < 0: no wait), then copies the latest value.
  void CopyLatest(int server, int slot, void* dst, size_t bytes, const std::string& what);
  // The pulls are all registered and their initial values arrived (the startup's fetch_barrier):
  // pushes may start. At most `queue_steps` steps wait in the queue (Submit blocks while it is
  // full); a push merges at most `max_merge` of them; CopyLatest's `max_staleness`.
  void Start(int queue_steps, int max_merge, int max_staleness);
  // Pushes what is queued and waits until the thread is idle (before a checkpoint or the end).
  void Flush();
  // Throws the thread's error, if any.
  void Check();
  // The latest pulled value of a block, if one was pulled (a checkpoint's parameters).
  bool Latest(int server, int slot, std::vector<char>* out);
  // Pushes done by the thread, and steps handed to it (Submit).
  int64_t pushes() const;
  int64_t submitted() const;

 private:
  struct Block {
    int server = 0, slot = 0;
    bool rows = false, sum = false;
    DType dtype = DType::kFloat32;
    std::vector<char> dense;   // dense bytes
    std::vector<int64_t> ids;  // rows
    std::vector<char> values;  // rows' values
    int64_t width = 0;
    int merged = 1;  // steps summed into it
    std::string what;
  };
  using Key = std::tuple<int, int>;  // (server, slot)
  using Step = std::map<Key, Block>;

  static Block NewBlock(int server, int slot, DType dtype, bool sum, const std::string& what);
  void Add(Block&& b);
  void Loop();
  static void Merge(Block* into, Block&& from);
  static void Average(Block* b);
  // Pushes `step`, then pulls every block; `follows`: the steps popped so far (this one's last).
  void Push(Step& step, int64_t follows);

  Transport* t_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Step building_;
  std::deque<Step> queue_;
  bool busy_ = false, stop_ = false, pulls_complete_ = false;
  size_t queue_steps_ = 1, max_merge_ = 1;
  int max_staleness_ = 0;
  // Steps taken from the queue for pushes, and of those, the ones the latest completed pull
  // follows (each push pulls every block back).
  int64_t popped_ = 0, pulled_ = 0;
  std::string error_;
  struct Pull {
    size_t bytes = 0;
    std::string what;
    std::vector<char> latest;
    bool have = false;
    const void* initial = nullptr;
  };
  std::map<Key, Pull> pulls_;
  std::map<Key, std::vector<char>> spare_;    // the buffers of the pull before the latest
  std::map<int, std::vector<char>> bundles_;  // server -> its reply's buffer (reused)
  int64_t pushes_ = 0, submitted_ = 0;
  std::thread thread_;
};

}  // namespace ps
}  // namespace keel
