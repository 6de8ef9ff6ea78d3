// What keel launch hands a worker besides its environment, read here so that the rendezvous can
// use it:
// - KEEL_LAUNCH_STORE_PORT (the workers of the node that runs rank 0): the launcher serves the
//   rendezvous store itself on that port (rank 0's), bound before the first attempt and held until
//   the last one ends, so rank 0 does not serve it: the store outlives any worker (a rank 0 that
//   finishes first, or dies), and between a failed attempt and its restart nobody else can listen
//   there and pose as the store.
// - KEEL_LAUNCH_STATUS_FD (every worker): the write end of a pipe to the launcher, on which the
//   rendezvous reports its progress ("rendezvous" when it starts, "joined" when this rank has
//   joined). The launcher uses it to tell a worker that exited 0 before joining (its peers would
//   wait for it until the comm timeout) from one that finished.
// The status pipe is checked against what the descriptor is (the pipe whose inode the variable
// names, "<fd>:<inode>"), so a stale variable in a process that did not inherit the pipe is
// ignored; KEEL_LAUNCH_STORE_PORT counts only with that pipe, i.e. under keel launch.
#pragma once

#include <string>

namespace keel {

// Whether keel launch serves the store on `port` (KEEL_LAUNCH_STORE_PORT, under a launcher's
// status pipe): then rank 0 is one of its clients instead of its server.
bool LauncherServesStore(int port);

// Writes "<event> <rank>\n" to the launcher's status pipe, when there is one. Never blocks and
// never fails: without a launcher listening it does nothing.
void TellLauncher(const std::string& event, int rank);

}  // namespace keel
