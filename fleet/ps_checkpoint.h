// Checkpoints of parameter-server jobs (docs/parameter-server.md, "Checkpoints"): what trainer 0
// writes and how a job of any number of servers and trainers starts again from it.
//
// A checkpoint is always the single-device program's persistables under their single-device
// names (the program every process built before minimize split it), so one process loads it with
// the program it builds without fleet, and a job of another shape cuts it along its own plan.
//
//   sync, async  the parameters trainer 0 holds (the servers' values after its last step) and
//                the optimizer state and learning rate pulled from every server, reassembled
//                from their blocks.
//   distributed  an is_distributed table (its rows live only on the servers, created on first
//   tables       touch): the rows every server created and their row-shaped optimizer state, by
//                id, with the rule the other rows start from (framework/io/checkpoint.h,
//                StoredRows); one process loading it fills the whole table, a server keeps the
//                rows it owns under this job's server count (id % servers).
//   GEO          the servers' parameters (pulled: the trainers' common model, every delta pushed
//                so far added) and trainer 0's own optimizer state and learning rate (GEO
//                servers hold no optimizer state; each trainer has its own).
#pragma once

#include <string>

#include "executor/executor.h"
#include "framework/io/checkpoint.h"
#include "framework/ir/program.h"

namespace keel {
namespace fleet {

// On every trainer, between two steps (before fleet::stop_worker): trainer 0 asks every server
// for what it holds and writes DIR/persistables.safetensors (with `state` as its training state
// when given, as save_checkpoint; else as save_persistables). The other trainers return at once.
// `program` is the trainer's main program that minimize made. A keel::Error names the server
// that did not answer.
void SavePsCheckpoint(Executor& exe, const std::string& dirname, const Program& program,
                      const TrainingState* state = nullptr);

// On a server, after its startup program and before its main program: its parameter blocks and
// (sync, async) the optimizer state of its blocks and the learning rate, cut from DIR's
// checkpoint along this job's plan (any number of servers and trainers), and the rows of the
// distributed tables it owns (from a one-process checkpoint: those that differ from their
// initial values). Returns the checkpoint's
// training state, if it has one. A var the checkpoint lacks, or of another shape, is a keel::Error
// naming it.
std::optional<TrainingState> LoadPsServerState(Executor& exe, const std::string& dirname,
                                               const Program& program);

}  // namespace fleet
}  // namespace keel
