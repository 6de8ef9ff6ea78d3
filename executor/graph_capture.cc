#include "executor/graph_capture.h"

#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "framework/op/op_registry.h"
#include "framework/runtime/allocator.h"
#include "framework/runtime/device.h"

DECLARE_bool(check_nan_inf);

namespace keel {

GraphCapturePolicy::Action GraphCapturePolicy::Next(const std::string& key, bool* drop_graph) {
  *drop_graph = false;
  if (!keyed_ || key != key_) {
    *drop_graph = captured_;
    captured_ = false;
    plain_runs_ = 0;
    key_ = key;
    keyed_ = true;
  }
  if (captured_) return Action::kReplay;
  if (plain_runs_ >= kWarmupRuns) return Action::kCapture;
  ++plain_runs_;
  return Action::kPlain;
}

std::string FeedSignature(const FeedMap& feed) {
  std::string s;
  for (auto& kv : feed) {  // a std::map: in name order
    const Tensor& t = kv.second;
    s += kv.first + ":" + DTypeName(t.dtype()) + t.dims().str() +
         (t.place().is_cpu() ? "@host" : "@" + t.place().str()) + ";";
  }
  return s;
}

std::string GraphCaptureBlocker(const Program& program, int block_idx) {
  const Block& block = program.block(block_idx);
  for (size_t i = 0; i < block.num_ops(); ++i) {
    const OpDesc* op = block.op(i);
    const std::string at = "op #" + std::to_string(i) + " " + op->type();
    if (op->HasAttr("sub_block"))
      return at + " runs a sub-block, and its condition comes to the host every step";
    const std::string& why = OpRegistry::Traits(op->type()).not_capturable;
    if (!why.empty()) return at + " " + why;
  }
  return "";
}

CapturedStep::~CapturedStep() {
  graph_.reset();  // waits for its last replay
  holds_.clear();
  if (done_ != nullptr) DeviceEventDestroy(place_, done_);
}

void CapturedStep::Drop() {
  graph_.reset();
  holds_.clear();
  policy_.Reset();
}

void CapturedStep::SetRings(std::vector<Communicator*> rings) {
  rings_ = std::move(rings);
  rings_known_ = true;
}

bool CapturedStep::BuffersIntact() const {
  for (const Hold& h : holds_) {
    const Tensor& t = h.var->tensor();
    if (!t.initialized() || t.holder() != h.holder || t.raw_data() != h.data ||
        t.nbytes() != h.bytes)
      return false;
  }
  return true;
}

GraphCapturePolicy::Action CapturedStep::Decide(const FeedMap& feed) {
  if (graph_ && !BuffersIntact()) Drop();
  bool drop = false;
  GraphCapturePolicy::Action action = policy_.Next(FeedSignature(feed), &drop);
  if (drop) Drop();
  // A rank whose feeds changed makes all run plain until it has warmed up; then all capture
  // together.
  if (!rings_.empty()) {
    Communicator& ring = *rings_.front();
    if (!vote_.initialized()) vote_.Alloc(DType::kInt32, DDim{1}, place_);
    const int32_t mine = static_cast<int32_t>(action);
    MemCopy(place_, vote_.raw_data(), CPUPlace(), &mine, sizeof(mine));
    DeviceSynchronize(place_);  // the ring's stream reads the vote the compute stream wrote
    ring.AllReduce(&vote_, ReduceOp::kMin);
    int32_t least = mine;
    MemCopy(CPUPlace(), &least, place_, vote_.raw_data(), sizeof(least));
    using Action = GraphCapturePolicy::Action;
    const auto agreed = static_cast<Action>(least);
    if (agreed == Action::kCapture && action == Action::kReplay) {
      graph_.reset();  // another rank captures anew: so does this one
      holds_.clear();
    }
    action = agreed;
  }
  return action;
}

void CapturedStep::CopyHostFeeds(const Step& step) {
  size_t i = 0;
  for (const std::string& name : feeds_) {
    const Tensor& t = step.feed->at(name);
    std::memcpy(graph_->Input(i++), t.raw_data(), t.nbytes());
  }
  *static_cast<int64_t*>(graph_->Input(i)) = step.run_index;
}

void CapturedStep::Capture(const Program& program, const Step& step) {
  // Checked here, not at the first run: a program that never reaches its capture (a startup
  // program) may hold ops a graph cannot.
  const std::string blocker = GraphCaptureBlocker(program);
  KEEL_ENFORCE(blocker.empty(), "ExecutionStrategy::use_cuda_graph: ", blocker,
               "; this program cannot be captured into a CUDA graph (set use_cuda_graph=false)");
  KEEL_ENFORCE(!FLAGS_check_nan_inf,
               "ExecutionStrategy::use_cuda_graph: FLAGS_check_nan_inf reads every output on the "
               "host after its op, which a CUDA graph cannot do");
  // Every ring a collective uses must run on a device stream (NCCL) to be captured.
  for (const Communicator* ring : rings_)
    KEEL_ENFORCE(std::string(ring->backend()) == "nccl", "ExecutionStrategy::use_cuda_graph: ring ",
                 ring->ring_id(), " (", ring->backend(),
                 ") waits on the host; a CUDA graph needs NCCL (--gpu_comm_backend=nccl, one GPU "
                 "per rank)");
  if (!device_run_index_.initialized()) device_run_index_.Alloc(DType::kInt64, DDim{1}, place_);
  std::vector<std::pair<void*, size_t>> inputs;
  feeds_.clear();
  for (auto& kv : *step.feed) {
    if (!kv.second.place().is_cpu()) continue;
    Tensor* dst = step.var(kv.first)->mutable_tensor();
    inputs.emplace_back(dst->raw_data(), dst->nbytes());
    feeds_.push_back(kv.first);
  }
  inputs.emplace_back(device_run_index_.raw_data(), sizeof(int64_t));
  std::unique_ptr<CudaGraph> graph = CudaGraph::Create(place_);
  const int64_t* run_index = device_run_index_.data<int64_t>();
  for (ExecutionContext* c : step.contexts) c->set_device_run_index(run_index);
  try {
    graph->BeginCapture(inputs);
    step.run_ops();
    graph->EndCapture();
  } catch (const Error& e) {
    graph->AbortCapture();
    for (ExecutionContext* c : step.contexts) c->set_device_run_index(nullptr);
    KEEL_THROW("ExecutionStrategy::use_cuda_graph: capturing the step into a CUDA graph failed: ",
               e.what());
  }
  for (ExecutionContext* c : step.contexts) c->set_device_run_index(nullptr);
  graph_ = std::move(graph);
  policy_.Captured();
  ++captures_;
  holds_.clear();
  for (Variable* v : step.vars) {
    const Tensor& t = v->tensor();
    if (t.initialized()) holds_.push_back({v, t.holder(), t.raw_data(), t.nbytes()});
  }
  CopyHostFeeds(step);
  graph_->Launch();  // the capture recorded the step; this runs it
  Watch();
}

void CapturedStep::Replay(const Step& step) {
  graph_->WaitInputs();
  CopyHostFeeds(step);
  graph_->Launch();
  Watch();
}

void CapturedStep::Watch() {
  // Without collectives nothing can hang: the run returns at once (a fetch waits for the stream).
  if (rings_.empty()) return;
  if (done_ == nullptr) done_ = DeviceEventCreate(place_);
  DeviceEventRecord(place_, done_, nullptr);
  double timeout_s = 0;
  for (Communicator* r : rings_) timeout_s = std::max(timeout_s, r->timeout_s());
  const auto start = std::chrono::steady_clock::now();
  while (!DeviceEventDone(place_, done_)) {
    const bool past =
        timeout_s > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s;
    for (Communicator* r : rings_) r->WatchDevice("a CUDA graph replay", past);
    KEEL_ENFORCE(!past, "a CUDA graph replay did not finish within ", timeout_s, " s");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace keel
