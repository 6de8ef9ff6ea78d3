// Streams and events: ordered queues of work that run beside the compute workers.
//
// The executor gives every communication ring its own Stream, so collectives run in program
// order on their ring while compute goes on; an Event marks a point in a stream that others wait
// for (c_sync_comm_stream waits for the ring's event before the optimizer reads the gradients).
// On CPU a stream is a thread with a FIFO queue (CpuStream); a CUDA stream per ring implements the
// same interface (Enqueue = launch on the stream, Record = cudaEventRecord, Event::Wait =
// cudaEventSynchronize), so the scheduler does not care which it drives.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace keel {

// Completes once; then Wait returns at once. Thread-safe.
class Event {
 public:
  virtual ~Event() = default;
  virtual bool Query() = 0;  // completed?
  virtual void Wait() = 0;   // blocks until completed
};

class Stream {
 public:
  virtual ~Stream() = default;
  // Queues `work`; work runs in the order it was enqueued, one item at a time.
  virtual void Enqueue(std::function<void()> work) = 0;
  // An event that completes when everything enqueued before it has run.
  virtual std::shared_ptr<Event> Record() = 0;
  // Blocks until everything enqueued so far has run.
  void Synchronize() { Record()->Wait(); }
  virtual const std::string& name() const = 0;
};

// A CPU stream: one thread that runs the queue and sleeps (no spinning) when it is empty.
// Work must not throw (the scheduler catches inside the work it enqueues).
class CpuStream : public Stream {
 public:
  explicit CpuStream(std::string name);
  ~CpuStream() override;  // runs what is queued, then joins the thread
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  void Enqueue(std::function<void()> work) override;
  std::shared_ptr<Event> Record() override;
  const std::string& name() const override { return name_; }

 private:
  void Loop();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// An event completed by whoever holds it (Signal); Wait sleeps on a condition variable.
class CpuEvent : public Event {
 public:
  bool Query() override;
  void Wait() override;
  void Signal();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

}  // namespace keel
