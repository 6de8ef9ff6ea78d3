// Topology: where each rank of a hybrid-parallel job sits, as Paddle's CommunicateTopology lays
// ranks out (fleet/base/topology.py: the coordinates are itertools.product over the axes
// [data, pipe, model], so the last axis varies fastest):
//
//   rank = (dp * pp_degree + pp) * tp_degree + tp
//
// Ranks of one tensor-parallel group are consecutive (they exchange activations every layer, so
// they sit on one node when a node holds tp_degree ranks or more); ranks of one data-parallel
// group are tp_degree * pp_degree apart.
//
// World 8 = dp2 x pp2 x tp2:
//   rank : 0 1 2 3 4 5 6 7
//   dp   : 0 0 0 0 1 1 1 1
//   pp   : 0 0 1 1 0 0 1 1
//   tp   : 0 1 0 1 0 1 0 1
//   tp groups {0,1} {2,3} {4,5} {6,7}; pp groups {0,2} {1,3} {4,6} {5,7};
//   dp groups {0,4} {1,5} {2,6} {3,7}.
//
// Rings. A group's ring is created by a c_comm_init with the group's ring id, the group's size and
// this rank's index in the group, and a `group` name that tells the groups apart (rings of one id
// but different groups rendezvous apart, framework/comm/comm_context.h):
//   data parallel:   ring ids 0 .. nccl_comm_num - 1 (the data-parallel passes' own), group
//                    "dp:pp<p>.tp<t>" when tp or pp split the world, else "" (the whole job);
//   tensor parallel: ring id kTensorParallelRingId (transpiler/tensor_parallel.h), group
//                    "tp:dp<d>.pp<p>".
//   pipeline:        ring id kPipelineRingId (transpiler/pipeline_pass.h), group
//                    "pp:dp<d>.tp<t>"; the index in the group is the rank's stage.
#pragma once

#include <string>
#include <vector>

namespace keel {
namespace fleet {

struct RankCoord {
  int dp = 0, pp = 0, tp = 0;
  bool operator==(const RankCoord& o) const { return dp == o.dp && pp == o.pp && tp == o.tp; }
};

class Topology {
 public:
  // A keel::Error naming the degree when a degree is < 1 or their product is not world_size.
  Topology(int world_size, int dp_degree, int pp_degree, int tp_degree);

  int world_size() const { return dp_ * pp_ * tp_; }
  int dp_degree() const { return dp_; }
  int pp_degree() const { return pp_; }
  int tp_degree() const { return tp_; }

  // rank in [0, world_size); a keel::Error otherwise.
  RankCoord Coord(int rank) const;
  int Rank(const RankCoord& c) const;

  // The ranks of `rank`'s group along one axis, in the order of that axis's coordinate (so the
  // index of `rank` in the list is its coordinate on that axis).
  std::vector<int> TpGroup(int rank) const;
  std::vector<int> PpGroup(int rank) const;
  std::vector<int> DpGroup(int rank) const;

  // The `group` names of `rank`'s rings (see above).
  std::string TpGroupName(int rank) const;
  std::string DpGroupName(int rank) const;
  std::string PpGroupName(int rank) const;

  // "dp2 x pp1 x tp2 (world 4)".
  std::string ToString() const;

 private:
  int dp_, pp_, tp_;
};

}  // namespace fleet
}  // namespace keel
