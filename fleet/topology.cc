#include "fleet/topology.h"

#include "framework/error.h"

namespace keel {
namespace fleet {

Topology::Topology(int world_size, int dp_degree, int pp_degree, int tp_degree)
    : dp_(dp_degree), pp_(pp_degree), tp_(tp_degree) {
  KEEL_ENFORCE(dp_ >= 1, "topology: dp_degree=", dp_, " must be >= 1");
  KEEL_ENFORCE(pp_ >= 1, "topology: pp_degree=", pp_, " must be >= 1");
  KEEL_ENFORCE(tp_ >= 1, "topology: tensor_parallel_degree=", tp_, " must be >= 1");
  KEEL_ENFORCE(dp_ * pp_ * tp_ == world_size, "topology: dp_degree=", dp_, " x pp_degree=", pp_,
               " x tensor_parallel_degree=", tp_, " = ", dp_ * pp_ * tp_, " is not the world size ",
               world_size);
}

RankCoord Topology::Coord(int rank) const {
  KEEL_ENFORCE(rank >= 0 && rank < world_size(), "topology: rank ", rank, " is outside [0, ",
               world_size(), ")");
  RankCoord c;
  c.tp = rank % tp_;
  c.pp = (rank / tp_) % pp_;
  c.dp = rank / (tp_ * pp_);
  return c;
}

int Topology::Rank(const RankCoord& c) const {
  KEEL_ENFORCE(c.dp >= 0 && c.dp < dp_ && c.pp >= 0 && c.pp < pp_ && c.tp >= 0 && c.tp < tp_,
               "topology: coordinate (dp ", c.dp, ", pp ", c.pp, ", tp ", c.tp, ") is outside ",
               ToString());
  return (c.dp * pp_ + c.pp) * tp_ + c.tp;
}

std::vector<int> Topology::TpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (c.tp = 0; c.tp < tp_; ++c.tp) g.push_back(Rank(c));
  return g;
}

std::vector<int> Topology::PpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (c.pp = 0; c.pp < pp_; ++c.pp) g.push_back(Rank(c));
  return g;
}

std::vector<int> Topology::DpGroup(int rank) const {
  RankCoord c = Coord(rank);
  std::vector<int> g;
  for (c.dp = 0; c.dp < dp_; ++c.dp) g.push_back(Rank(c));
  return g;
}

std::string Topology::TpGroupName(int rank) const {
  const RankCoord c = Coord(rank);
  return StrCat("tp:dp", c.dp, ".pp", c.pp);
}

std::string Topology::DpGroupName(int rank) const {
  const RankCoord c = Coord(rank);
  if (pp_ == 1 && tp_ == 1) return "";
  return StrCat("dp:pp", c.pp, ".tp", c.tp);
}

std::string Topology::PpGroupName(int rank) const {
  const RankCoord c = Coord(rank);
  return StrCat("pp:dp", c.dp, ".tp", c.tp);
}

std::string Topology::ToString() const {
  return StrCat("dp", dp_, " x pp", pp_, " x tp", tp_, " (world ", world_size(), ")");
}

}  // namespace fleet
}  // namespace keel
