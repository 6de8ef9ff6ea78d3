// EventPlan: how ops on different streams of a CUDA place are ordered without host syncs.
//
// On a CUDA place every compute op is enqueued on the device's compute stream (lane 0) and every
// collective on its ring's stream (lane ring_id + 1). The host enqueues an op only after its
// dependency-graph predecessors were enqueued, but streams run on their own, so where an edge
// crosses lanes the plan puts an event: the predecessor records one on its stream after it runs,
// and the op's stream waits for it (cudaStreamWaitEvent) before the op. In a transpiled program
// those edges are exactly c_sync_calc_stream -> c_allreduce_* (the ring waits for the gradient) and
// c_sync_comm_stream -> the optimizer ops (compute waits for the all-reduce), so the ring runs
// beside the rest of backward. A wait is left out when a predecessor on the op's own lane already
// ordered the stream after that event (the stream runs in enqueue order). At the end of a run the
// compute stream waits for the last op of every ring lane, so a fetch, or the next run's writes,
// come after the collectives.
//
// Plain C++ over the dependency graph: CPU tests check the plan of transpiled programs.
#pragma once

#include <string>
#include <vector>

#include "executor/scheduler.h"

namespace keel {

struct EventPlan {
  std::vector<char> record_after;       // per op: record an event on its lane after it runs
  std::vector<std::vector<int>> waits;  // per op: ops whose events its lane waits for first
  std::vector<int> final_waits;         // ops whose events the compute lane waits for at the end
};

// lane_of[i]: 0 for the compute stream, r + 1 for ring r's stream (ops whose schema declares
// OpTraits::on_ring, CPU: the ring's thread, CUDA: the ring's CUDA stream).
EventPlan PlanEvents(const DependencyGraph& graph, const std::vector<int>& lane_of);

}  // namespace keel
