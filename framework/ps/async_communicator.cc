#include "framework/ps/async_communicator.h"

#include <algorithm>
#include <cstring>

#include "framework/base/strings.h"
#include "framework/error.h"
#include "framework/fault_point.h"
#include "framework/ps/ps_transport.h"

namespace keel {
namespace ps {

namespace {

template <typename T>
void AddInto(T* into, const T* from, size_t n) {
  for (size_t i = 0; i < n; ++i) into[i] += from[i];
}

// into += from, as `dtype` elements (float32 or float64; other types are refused).
void AddBytes(DType dtype, char* into, const char* from, size_t bytes, const std::string& what) {
  if (dtype == DType::kFloat32) {
    AddInto(reinterpret_cast<float*>(into), reinterpret_cast<const float*>(from),
            bytes / sizeof(float));
  } else {
    KEEL_ENFORCE(dtype == DType::kFloat64, what, ": the asynchronous communicator merges float32 ",
                 "or float64 gradients, not ", DTypeName(dtype));
    AddInto(reinterpret_cast<double*>(into), reinterpret_cast<const double*>(from),
            bytes / sizeof(double));
  }
}

void ScaleBytes(DType dtype, char* data, size_t bytes, double scale) {
  if (dtype == DType::kFloat32) {
    float* p = reinterpret_cast<float*>(data);
    for (size_t i = 0; i < bytes / sizeof(float); ++i) p[i] *= static_cast<float>(scale);
  } else {
    double* p = reinterpret_cast<double*>(data);
    for (size_t i = 0; i < bytes / sizeof(double); ++i) p[i] *= scale;
  }
}

}  // namespace

AsyncCommunicator::AsyncCommunicator(Transport* t) : t_(t) {
  thread_ = std::thread([this] { Loop(); });
}

AsyncCommunicator::~AsyncCommunicator() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void AsyncCommunicator::Check() {
  std::lock_guard<std::mutex> lk(mu_);
  KEEL_ENFORCE(error_.empty(), error_);
}

AsyncCommunicator::Block AsyncCommunicator::NewBlock(int server, int slot, DType dtype, bool sum,
                                                     const std::string& what) {
  Block b;
  b.server = server;
  b.slot = slot;
  b.dtype = dtype;
  b.sum = sum;
  b.what = what;
  return b;
}

void AsyncCommunicator::Add(Block&& b) {
  std::lock_guard<std::mutex> lk(mu_);
  KEEL_ENFORCE(error_.empty(), error_);
  const std::string what = b.what;
  KEEL_ENFORCE(building_.emplace(Key{b.server, b.slot}, std::move(b)).second, what,
               ": a second gradient of the same block in one step");
}

void AsyncCommunicator::AddDense(int server, int slot, DType dtype, const void* data, size_t bytes,
                                 bool sum, const std::string& what) {
  Block b = NewBlock(server, slot, dtype, sum, what);
  b.dense.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  Add(std::move(b));
}

void AsyncCommunicator::AddRows(int server, int slot, DType dtype, std::vector<int64_t> rows,
                                const void* values, int64_t width, bool sum,
                                const std::string& what) {
  Block b = NewBlock(server, slot, dtype, sum, what);
  b.rows = true;
  b.width = width;
  const size_t bytes = rows.size() * static_cast<size_t>(width) * SizeOf(dtype);
  b.values.assign(static_cast<const char*>(values), static_cast<const char*>(values) + bytes);
  b.ids = std::move(rows);
  Add(std::move(b));
}

void AsyncCommunicator::Submit() {
  std::unique_lock<std::mutex> lk(mu_);
  KEEL_ENFORCE(error_.empty(), error_);
  if (building_.empty()) return;
  cv_.wait(lk, [&] { return queue_.size() < queue_steps_ || !error_.empty(); });
  KEEL_ENFORCE(error_.empty(), error_);
  queue_.push_back(std::move(building_));
  building_.clear();
  ++submitted_;
  cv_.notify_all();
}

void AsyncCommunicator::AddPull(int server, int slot, size_t bytes, const std::string& what,
                                const void* initial) {
  std::lock_guard<std::mutex> lk(mu_);
  Pull& p = pulls_[Key{server, slot}];
  p.bytes = bytes;
  p.what = what;
  p.initial = initial;
}

void AsyncCommunicator::Start(int queue_steps, int max_merge, int max_staleness) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_steps_ = static_cast<size_t>(std::max(queue_steps, 1));
    max_merge_ = static_cast<size_t>(std::max(max_merge, 1));
    max_staleness_ = max_staleness;
    for (auto& [key, p] : pulls_) {
      if (p.initial == nullptr) continue;
      const char* from = static_cast<const char*>(p.initial);
      p.latest.assign(from, from + p.bytes);
      p.have = true;
      p.initial = nullptr;
    }
    pulls_complete_ = true;
  }
  cv_.notify_all();
}

void AsyncCommunicator::CopyLatest(int server, int slot, void* dst, size_t bytes,
                                   const std::string& what) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = pulls_.find(Key{server, slot});
  KEEL_ENFORCE(it != pulls_.end(), what, ": no pull of this block was registered");
  // The pull after the trainer's previous step (but max_staleness_ steps), if that is asked.
  cv_.wait(lk, [&] {
    return (it->second.have && (max_staleness_ < 0 || pulled_ + max_staleness_ >= submitted_)) ||
           !error_.empty();
  });
  KEEL_ENFORCE(error_.empty(), error_);
  KEEL_ENFORCE(it->second.latest.size() == bytes, what, ": pulled ", it->second.latest.size(),
               " bytes, the block holds ", bytes);
  std::memcpy(dst, it->second.latest.data(), bytes);
}

bool AsyncCommunicator::Latest(int server, int slot, std::vector<char>* out) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = pulls_.find(Key{server, slot});
  if (it == pulls_.end() || !it->second.have) return false;
  *out = it->second.latest;
  return true;
}

void AsyncCommunicator::Flush() {
  Submit();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return (queue_.empty() && !busy_) || !error_.empty(); });
  KEEL_ENFORCE(error_.empty(), error_);
}

int64_t AsyncCommunicator::pushes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return pushes_;
}

int64_t AsyncCommunicator::submitted() const {
  std::lock_guard<std::mutex> lk(mu_);
  return submitted_;
}

void AsyncCommunicator::Merge(Block* into, Block&& from) {
  if (!into->rows) {
    AddBytes(into->dtype, into->dense.data(), from.dense.data(),
             std::min(into->dense.size(), from.dense.size()), into->what);
  } else {
    // The union of the rows, each summed in queue order.
    const size_t row = static_cast<size_t>(into->width) * SizeOf(into->dtype);
    std::vector<int64_t> ids;
    std::vector<char> values;
    size_t a = 0, b = 0;
    while (a < into->ids.size() || b < from.ids.size()) {
      const bool take_a =
          b == from.ids.size() || (a < into->ids.size() && into->ids[a] <= from.ids[b]);
      const bool take_b =
          a == into->ids.size() || (b < from.ids.size() && from.ids[b] <= into->ids[a]);
      const size_t at = values.size();
      if (take_a) {
        ids.push_back(into->ids[a]);
        values.insert(values.end(), into->values.begin() + a * row,
                      into->values.begin() + (a + 1) * row);
      } else {
        ids.push_back(from.ids[b]);
        values.insert(values.end(), from.values.begin() + b * row,
                      from.values.begin() + (b + 1) * row);
      }
      if (take_a && take_b)
        AddBytes(into->dtype, values.data() + at, from.values.data() + b * row, row, into->what);
      if (take_a) ++a;
      if (take_b) ++b;
    }
    into->ids = std::move(ids);
    into->values = std::move(values);
  }
  into->merged += from.merged;
}

void AsyncCommunicator::Average(Block* b) {
  if (b->sum || b->merged == 1) return;
  const double scale = 1.0 / b->merged;
  if (b->rows) {
    ScaleBytes(b->dtype, b->values.data(), b->values.size(), scale);
  } else {
    ScaleBytes(b->dtype, b->dense.data(), b->dense.size(), scale);
  }
}

void AsyncCommunicator::Loop() {
  for (;;) {
    Step step;
    int64_t follows = 0;  // the steps popped so far, this push's last
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || (!queue_.empty() && error_.empty()); });
      if (stop_) return;
      // Up to max_merge_ queued steps, merged into the first.
      step = std::move(queue_.front());
      queue_.pop_front();
      ++popped_;
      for (size_t merged = 1; merged < max_merge_ && !queue_.empty(); ++merged, ++popped_) {
        for (auto& [key, b] : queue_.front()) {
          auto it = step.find(key);
          if (it == step.end()) {
            step.emplace(key, std::move(b));
          } else {
            Merge(&it->second, std::move(b));
          }
        }
        queue_.pop_front();
      }
      busy_ = true;
      follows = popped_;
      cv_.notify_all();  // room in the queue
    }
    std::string error;
    try {
      for (auto& [key, b] : step) Average(&b);
      Push(step, follows);
    } catch (const std::exception& e) {
      error = e.what();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      busy_ = false;
      if (!error.empty() && error_.empty()) error_ = error;
      if (error.empty()) ++pushes_;
    }
    cv_.notify_all();
  }
}

void AsyncCommunicator::Push(Step& step, int64_t follows) {
  Transport& t = *t_;
  std::vector<std::unique_ptr<Transport::Transfer>> sends;
  const int64_t n = t.NextPushStep();
  // Server by server (the header, then the blocks), trainer i starting after server i: the order
  // changes nothing (every server has the whole push before the trainer pulls), but a test can
  // then hold one server's part back (FaultDelay) and make each server serve the trainers'
  // pushes in a different order.
  const int S = t.nservers(), me = t.rank() - S;
  // Each server's part is one message after the header (ps::PushSection's): a message per block
  // cost more than its bytes (docs/parameter-server.md, "Transport").
  for (int k = 1; k <= S; ++k) {
    const int server = (me + k) % S;
    FaultDelay(StrCat("ps_push_to_server", server));
    std::vector<char> bundle;
    auto append = [&bundle](const void* p, size_t bytes) {
      if (bytes > 0)
        bundle.insert(bundle.end(), static_cast<const char*>(p),
                      static_cast<const char*>(p) + bytes);
    };
    for (auto& [key, b] : step) {
      if (b.server != server) continue;
      PushSection s;
      s.slot = b.slot;
      s.rows = b.rows ? 1 : 0;
      if (!b.rows) {
        s.bytes = static_cast<int64_t>(b.dense.size());
        append(&s, sizeof(s));
        append(b.dense.data(), b.dense.size());
        continue;
      }
      // The row count, then the rows and their values.
      const int64_t count = static_cast<int64_t>(b.ids.size());
      s.bytes = static_cast<int64_t>(sizeof(count) + count * sizeof(int64_t) + b.values.size());
      append(&s, sizeof(s));
      append(&count, sizeof(count));
      append(b.ids.data(), count * sizeof(int64_t));
      append(b.values.data(), b.values.size());
    }
    if (bundle.empty()) continue;  // no block of this server (it has none)
    sends.push_back(t.PostPushHeader(server, n, static_cast<int64_t>(bundle.size())));
    sends.push_back(t.PostSend(server, Slot(Kind::kBundle, 0, n), std::move(bundle),
                               StrCat("trainer ", me, ": push ", n, " to ", t.PeerName(server))));
  }
  // Every parameter block back (the server posts them after its step), its receive posted with
  // the sends, into the buffers of the pull before last.
  std::map<Key, Pull> want;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return pulls_complete_ || stop_; });
    if (stop_) return;
    for (const auto& [key, p] : pulls_) {
      Pull& w = want[key];
      w.bytes = p.bytes;
      w.what = p.what;
      w.latest.swap(spare_[key]);
    }
  }
  // Each server's blocks come back as one message (its bundle), received whole, then copied to
  // each block's buffer.
  std::map<int, std::vector<BundleBlock>> of;  // server -> its pulls' buffers
  std::map<int, const std::string*> first;     // server -> its first pull's name, for errors
  for (auto& [key, p] : want) {
    p.latest.resize(p.bytes);
    of[std::get<0>(key)].push_back({std::get<1>(key), p.latest.data(), p.bytes});
    first.emplace(std::get<0>(key), &p.what);
  }
  std::vector<std::pair<int, std::unique_ptr<Transport::Transfer>>> recvs;
  for (const auto& [server, blocks] : of) {
    std::vector<char>& buf = bundles_[server];
    buf.resize(BundleBytes(blocks));
    recvs.emplace_back(server,
                       t.PostRecv({server}, Slot(Kind::kBundle, 0, n), buf.data(), buf.size(),
                                  StrCat("the pull of ", blocks.size(), " blocks (", *first[server],
                                         ", ...) after push ", n)));
  }
  for (auto& s : sends) t.Wait(*s);
  for (auto& [server, r] : recvs) {
    t.Wait(*r);
    UnpackBundle(bundles_[server], of[server], r->what);
  }
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [key, p] : want) {
    Pull& into = pulls_[key];
    into.latest.swap(p.latest);
    into.have = true;
    spare_[key].swap(p.latest);  // the previous latest, reused by the next pull
  }
  pulled_ = follows;
  cv_.notify_all();  // CopyLatest may wait for this pull
}

}  // namespace ps
}  // namespace keel
