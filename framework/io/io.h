// Files: tensors and checkpoints as safetensors, programs as binary ProgramDesc (`__model__`).
// Every write goes to a temp file in the same directory, is fsync'ed and renamed into place, so a
// reader sees the old file or the new one, never half of one. Readers check every size and offset
// against the file before trusting it; a bad file is a keel::Error naming the file.
//
// The umbrella of framework/io for users (<keel/keel.h> includes it); keel's own code includes
// the header of what it uses.
#pragma once

#include "framework/io/atomic_file.h"
#include "framework/io/checkpoint.h"
#include "framework/io/prune.h"
#include "framework/io/safetensors.h"
