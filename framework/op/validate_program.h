// ValidateProgram: checks a whole program against the op registry before anything runs it, so a
// crafted or corrupt program (a file, a hand-built or ported one) is a keel::Error, never a crash
// or a silent misreading. LoadProgram and the executor call it.
//
// Checked: every op type is registered; its input and output slots are declared by its schema,
// required ones set, single ones given one variable; its attributes are declared (op_role and
// op_role_var excepted), of the declared type, pass the schema's checks, and required ones are
// set; every variable an op names is declared in its block or an ancestor; a block attribute
// names an existing block whose parent is the op's block (so calls only go down the block tree
// and cannot recurse); every variable's dims are >= -1, at most DDim::kMaxRank of them, and the
// product of the known ones fits in int64.
#pragma once

#include <string>

#include "framework/ir/program.h"

namespace keel {

// `what` names the program's source (a file) at the start of the error.
void ValidateProgram(const Program& program, const std::string& what);

}  // namespace keel
