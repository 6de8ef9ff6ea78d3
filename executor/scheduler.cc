#include "executor/scheduler.h"

#include <glog/logging.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "framework/runtime/cpu_threads.h"

namespace keel {

DependencyGraph::DependencyGraph(const std::vector<OpAccess>& ops,
                                 const std::map<std::string, std::string>& slice_of)
    : succ_(ops.size()), preds_(ops.size(), 0) {
  // Per variable since its last full write: the writer, the readers, and for a fused buffer the
  // ops that wrote or read its slices.
  struct Access {
    int writer = -1;
    std::vector<int> readers, slice_writers, slice_readers;
  };
  std::unordered_map<std::string, Access> vars;
  int barrier = -1;
  const int n = static_cast<int>(ops.size());
  for (int i = 0; i < n; ++i) {
    const OpAccess& op = ops[i];
    if (op.barrier) {
      for (int j = barrier < 0 ? 0 : barrier; j < i; ++j) AddEdge(j, i);
      barrier = i;
      vars.clear();  // every later op depends on the barrier, hence on all before it
      continue;
    }
    if (barrier >= 0) AddEdge(barrier, i);
    auto add_all = [&](const std::vector<int>& from) {
      for (int j : from) AddEdge(j, i);
    };
    for (const std::string& name : op.reads) {
      Access& v = vars[name];
      AddEdge(v.writer, i);  // read after write
      add_all(v.slice_writers);
      v.readers.push_back(i);
      auto buf = slice_of.find(name);
      if (buf != slice_of.end()) {
        Access& b = vars[buf->second];
        AddEdge(b.writer, i);
        b.slice_readers.push_back(i);
      }
    }
    for (const std::string& name : op.writes) {
      Access& v = vars[name];
      AddEdge(v.writer, i);  // write after write
      add_all(v.readers);    // write after read
      add_all(v.slice_writers);
      add_all(v.slice_readers);
      v.writer = i;
      v.readers.clear();
      v.slice_writers.clear();
      v.slice_readers.clear();
      auto buf = slice_of.find(name);
      if (buf != slice_of.end()) {
        Access& b = vars[buf->second];
        AddEdge(b.writer, i);
        add_all(b.readers);
        b.slice_writers.push_back(i);
      }
    }
  }
  for (auto& s : succ_) {
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
  }
  std::fill(preds_.begin(), preds_.end(), 0);
  for (auto& s : succ_)
    for (int j : s) ++preds_[j];
}

void DependencyGraph::AddEdge(int from, int to) {
  if (from < 0 || from == to) return;
  succ_[from].push_back(to);
}

bool DependencyGraph::HasEdge(int from, int to) const {
  const auto& s = succ_[from];
  return std::binary_search(s.begin(), s.end(), to);
}

void DependencyGraph::RemoveEdge(int from, int to) {
  auto& s = succ_[from];
  auto it = std::lower_bound(s.begin(), s.end(), to);
  if (it == s.end() || *it != to) return;
  s.erase(it);
  --preds_[to];
}

int DependencyGraph::MaxWidth() const {
  // Edges go forward in program order, so one pass in that order sees every op's depth final.
  std::vector<int> depth(size(), 0), count(size() + 1, 0);
  int width = 0;
  for (size_t i = 0; i < size(); ++i) {
    width = std::max(width, ++count[depth[i]]);
    for (int j : succ_[i]) depth[j] = std::max(depth[j], depth[i] + 1);
  }
  return width;
}

namespace {

struct RunState {
  const DependencyGraph& graph;
  const Scheduler::StreamOf& stream_of;
  const std::function<void(int)>& run_op;
  int workers;

  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> pending;                                             // predecessors not yet done
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;  // program order first
  // Per stream, its ops in program order and the next one to enqueue.
  struct StreamQueue {
    std::vector<int> ops;
    size_t next = 0;
  };
  std::unordered_map<Stream*, StreamQueue> streams;
  std::vector<char> stream_op_ready;
  int running = 0;      // compute ops being run
  int tasks = 0;        // pool workers started and not yet returned
  int in_stream = 0;    // ops enqueued on a stream and not yet done
  uint64_t events = 0;  // bumped (under mu) with every notify: ops done, kernels' pieces posted
  // Called by cpu_threads whenever a ParallelFor starts (never while this thread holds mu).
  std::function<void()> on_job = [this] {
    std::lock_guard<std::mutex> lock(mu);
    ++events;
    cv.notify_all();
  };
  size_t done = 0;
  std::exception_ptr error;

  RunState(const DependencyGraph& g, const Scheduler::StreamOf& s,
           const std::function<void(int)>& r, int w)
      : graph(g), stream_of(s), run_op(r), workers(w) {}

  bool Idle() const { return done == graph.size() || (error && running == 0 && in_stream == 0); }

  // Called with mu held.
  void MakeReady(int i) {
    Stream* stream = stream_of.empty() ? nullptr : stream_of[i];
    if (stream == nullptr) {
      ready.push(i);
      return;
    }
    stream_op_ready[i] = 1;
    StreamQueue& q = streams[stream];
    while (q.next < q.ops.size() && stream_op_ready[q.ops[q.next]]) {
      int j = q.ops[q.next++];
      ++in_stream;
      stream->Enqueue([this, j] { RunOnStream(j); });
    }
  }

  void Finish(int i, std::exception_ptr err) {  // mu held
    if (err) {
      if (!error) error = err;
      return;
    }
    ++done;
    for (int j : graph.successors(i))
      if (--pending[j] == 0) MakeReady(j);
  }

  void RunOnStream(int i) {
    std::exception_ptr err;
    bool skip;
    {
      std::lock_guard<std::mutex> lock(mu);
      skip = error != nullptr;
    }
    if (!skip) {
      try {
        run_op(i);
      } catch (...) {
        err = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    --in_stream;
    if (!skip) Finish(i, err);
    ++events;
    cv.notify_all();  // under the lock: the caller may return (and free this) once it is free
  }

  void Work(bool caller) {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (!error && !ready.empty() && running < workers) {
        int i = ready.top();
        ready.pop();
        ++running;
        // More ready ops than workers running them: start another worker if the budget allows.
        if (!ready.empty() && 1 + tasks < workers &&
            cpu_threads::Schedule([this] { Work(/*caller=*/false); }))
          ++tasks;
        lock.unlock();
        std::exception_ptr err;
        try {
          run_op(i);
        } catch (...) {
          err = std::current_exception();
        }
        lock.lock();
        --running;
        Finish(i, err);
        ++events;
        cv.notify_all();
        // A pool worker gives its thread back when a kernel's pieces wait for one (the caller
        // starts workers again while more ops are ready than run).
        if (!caller && cpu_threads::HelpWanted()) break;
        continue;
      }
      if (!caller || Idle()) break;
      // Nothing ready here: run pieces of a kernel that another worker is running, else sleep
      // until an op finishes or a kernel starts pieces (the help listener).
      const uint64_t seen = events;
      lock.unlock();
      const bool helped = cpu_threads::HelpOnce();
      lock.lock();
      if (helped || events != seen) continue;  // look again before sleeping
      cv.wait(lock);
    }
    if (!caller) {
      --tasks;
      ++events;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [this] { return tasks == 0 && in_stream == 0 && running == 0; });
  }
};

}  // namespace

void Scheduler::Run(const DependencyGraph& graph, const StreamOf& stream_of, int workers,
                    const std::function<void(int)>& run_op) {
  const int n = static_cast<int>(graph.size());
  if (n == 0) return;
  CHECK(stream_of.empty() || stream_of.size() == graph.size());
  RunState st(graph, stream_of, run_op, std::max(1, workers));
  st.pending.resize(n);
  st.stream_op_ready.assign(n, 0);
  for (int i = 0; i < n; ++i) {
    st.pending[i] = graph.num_predecessors(i);
    if (!stream_of.empty() && stream_of[i]) st.streams[stream_of[i]].ops.push_back(i);
  }
  {
    std::lock_guard<std::mutex> lock(st.mu);
    for (int i = 0; i < n; ++i)
      if (st.pending[i] == 0) st.MakeReady(i);
  }
  cpu_threads::AddHelpListener(&st.on_job);
  st.Work(/*caller=*/true);
  cpu_threads::RemoveHelpListener(&st.on_job);
  if (st.error) std::rethrow_exception(st.error);
  CHECK_EQ(st.done, graph.size()) << "scheduler: ops left unrun without an error (a cycle?)";
}

}  // namespace keel
