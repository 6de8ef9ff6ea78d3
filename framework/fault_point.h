// Fault injection for tests of crash consistency: FaultPoint("name") kills this process with
// SIGKILL when the environment variable KEEL_FAULT_POINT equals "name" (or "name@rank" where
// rank matches RANK/PADDLE_TRAINER_ID). Used at the few places where a kill must be shown to
// leave nothing torn or leaked (between the renames that publish an inference model, between a
// shared-memory segment's creation and its mapping, mid-checkpoint). Costs one getenv when unset.
#pragma once

#include <string>

namespace keel {

void FaultPoint(const char* name);

// Delay injection for tests of races between processes: FaultDelay("name") sleeps when the
// environment variable KEEL_FAULT_DELAY lists "name@rank:ms" (comma-separated entries; rank as
// above) for this process, so that a test can force one order of messages between processes.
// "name@rank:ms@PATH" waits until the file PATH exists instead, and throws a keel::Error naming it
// when that takes longer than ms (a test's proof that another process got on without this one).
// Costs one getenv when unset.
void FaultDelay(const std::string& name);

}  // namespace keel
