#include "executor/stream.h"

#include <pthread.h>

#include "framework/runtime/cpu_threads.h"

namespace keel {

CpuStream::CpuStream(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] {
    cpu_threads::BlockSignalsInThisThread();
    Loop();
  });
  // Visible in top/gdb as the ring's thread (names are at most 15 characters).
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());
}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void CpuStream::Enqueue(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(work));
  }
  cv_.notify_one();
}

std::shared_ptr<Event> CpuStream::Record() {
  auto event = std::make_shared<CpuEvent>();
  Enqueue([event] { event->Signal(); });
  return event;
}

void CpuStream::Loop() {
  for (;;) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

bool CpuEvent::Query() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void CpuEvent::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
}

void CpuEvent::Signal() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

}  // namespace keel
