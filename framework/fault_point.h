// Fault injection for tests of crash consistency: FaultPoint("name") kills this process with
// SIGKILL when the environment variable KEEL_FAULT_POINT equals "name" (or "name@rank" where
// rank matches RANK/PADDLE_TRAINER_ID). Used at the few places where a kill must be shown to
// leave nothing torn or leaked (between the renames that publish an inference model, between a
// shared-memory segment's creation and its mapping, mid-checkpoint). Costs one getenv when unset.
#pragma once

namespace keel {

void FaultPoint(const char* name);

}  // namespace keel
