#include "executor/event_plan.h"

#include <glog/logging.h>

#include <algorithm>
#include <set>

namespace keel {

EventPlan PlanEvents(const DependencyGraph& graph, const std::vector<int>& lane_of) {
  const int n = static_cast<int>(graph.size());
  CHECK_EQ(lane_of.size(), graph.size());
  int lanes = 1;
  for (int l : lane_of) lanes = std::max(lanes, l + 1);
  std::vector<std::vector<int>> preds(n);
  for (int i = 0; i < n; ++i)
    for (int j : graph.successors(i)) preds[j].push_back(i);
  EventPlan plan;
  plan.record_after.assign(n, 0);
  plan.waits.resize(n);
  // covered[i][s], s >= 1: the latest op of ring lane s that op i's stream is ordered after once i
  // has run (-1: none). Ring lanes run their ops in program order (the scheduler enqueues them so),
  // so an event of op q covers every earlier op of q's lane; the compute lane enqueues in whatever
  // order ops become ready, so its events cover only what the graph orders before them and each
  // compute predecessor is waited for itself. Edges go forward in program order, so predecessors
  // are final when op j is reached.
  std::vector<std::vector<int>> covered(n, std::vector<int>(lanes, -1));
  auto merge = [&](std::vector<int>& into, const std::vector<int>& from) {
    for (int s = 1; s < lanes; ++s) into[s] = std::max(into[s], from[s]);
  };
  for (int j = 0; j < n; ++j) {
    const int lane = lane_of[j];
    std::vector<int>& cov = covered[j];
    for (int p : preds[j])  // enqueued before j on j's own stream: j inherits p's ordering
      if (lane_of[p] == lane) merge(cov, covered[p]);
    std::vector<int> latest(lanes, -1);  // per ring lane, j's latest predecessor there
    for (int p : preds[j]) {
      const int s = lane_of[p];
      if (s == lane) continue;
      if (s == 0) {
        plan.waits[j].push_back(p);
        plan.record_after[p] = 1;
        merge(cov, covered[p]);
      } else {
        latest[s] = std::max(latest[s], p);
      }
    }
    for (int s = 1; s < lanes; ++s) {
      const int q = latest[s];
      if (s == lane || q < 0 || q <= cov[s]) continue;
      plan.waits[j].push_back(q);
      plan.record_after[q] = 1;
      merge(cov, covered[q]);
      cov[s] = q;
    }
    if (lane >= 1) cov[lane] = j;
  }
  // The compute lane waits for each ring lane's last op at the end of the run.
  std::vector<int> last(lanes, -1);
  for (int i = 0; i < n; ++i) last[lane_of[i]] = i;
  for (int s = 1; s < lanes; ++s) {
    if (last[s] < 0) continue;
    plan.final_waits.push_back(last[s]);
    plan.record_after[last[s]] = 1;
  }
  return plan;
}

}  // namespace keel
