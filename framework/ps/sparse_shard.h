// A distributed embedding table's shard on one parameter server (docs/sparse-embeddings.md,
// is_distributed): the rows of the ids this server owns (id % servers) that trainers touched,
// each created on first touch. The rows live in ordinary variables of the server's scope, row k
// of each for the k-th id created: the table [n, D], the optimizer state with the table's shape
// (Adam's moments, [n, D] each) and the ids themselves (int64 [n]); so the optimizer ops run on
// them unchanged, given a row-sparse gradient whose rows are those row numbers. The variables
// keep spare capacity (doubling), so that creating a row moves nothing in general.
//
// Row initialization (framework/runtime/row_init.h) is deterministic per id, so rows depend
// neither on the number of servers nor on the order of the touches, and one process that
// initializes the whole table with the same rule (op row_seeded_random) holds the same rows.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "framework/runtime/row_init.h"
#include "framework/runtime/scope.h"

namespace keel {
namespace ps {

// A shard described in a checkpoint transfer (listen_and_serv sends it, fleet's checkpoint reads
// it): its row count, its rule and each state var's value in a new row, as int64s (floats as
// their bits). `states` state vars: 5 + states entries.
struct ShardHeader {
  int64_t rows = 0;
  RowInitRule rule;
  std::vector<float> state_init;
  std::vector<int64_t> Encode() const;
  static ShardHeader Decode(const std::vector<int64_t>& words);
  static size_t Words(size_t states) { return 5 + states; }
};

class SparseShard {
 public:
  // `table`, `state` (each with the table's rows; `state_init` its value in a new row) and `ids`
  // are the server's variables; `width` the table's row width. Rows the variables already hold
  // (n ids, [n, width] each; a checkpoint's) are the shard's first rows.
  SparseShard(std::string name, Variable* table, std::vector<Variable*> state,
              std::vector<float> state_init, Variable* ids, int64_t width, RowInitRule rule,
              DType dtype);

  // The row number of `id`, created (initialized) if it is new.
  int64_t Row(int64_t id);
  int64_t rows() const { return static_cast<int64_t>(row_of_.size()); }
  const std::string& name() const { return name_; }
  const Variable* table() const { return table_; }
  const Variable* ids() const { return ids_; }
  const std::vector<Variable*>& state() const { return state_; }
  const std::vector<float>& state_init() const { return state_init_; }
  const RowInitRule& rule() const { return rule_; }

 private:
  void Grow();
  void CheckAdopted(const Variable* v, int64_t n) const;

  std::string name_;
  Variable* table_;
  std::vector<Variable*> state_;
  std::vector<float> state_init_;
  Variable* ids_;
  int64_t width_;
  RowInitRule rule_;
  DType dtype_;
  int64_t capacity_ = 0;
  std::unordered_map<int64_t, int64_t> row_of_;
};

}  // namespace ps
}  // namespace keel
