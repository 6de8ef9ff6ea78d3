// What keel launch hands a worker besides its environment, read here so that the rendezvous can
// use it:
// - KEEL_STORE_LISTEN_FD (rank 0 only): the store's listening socket. The launcher binds rank 0's
//   port before the first attempt and holds it until the last one ends, so between a failed
//   attempt and its restart nobody else can listen there and pose as the store.
// - KEEL_LAUNCH_STATUS_FD (every worker): the write end of a pipe to the launcher, on which the
//   rendezvous reports its progress ("rendezvous" when it starts, "joined" when this rank has
//   joined). The launcher uses it to tell a worker that exited 0 before joining (its peers would
//   wait for it until the comm timeout) from one that finished.
// Both variables are checked against what the descriptor is (a listening socket on the store's
// port; the pipe whose inode the variable names, "<fd>:<inode>"), so a stale variable in a
// process that did not inherit the descriptor is ignored.
#pragma once

#include <string>

namespace keel {

// A duplicate (close-on-exec) of the inherited listening socket when KEEL_STORE_LISTEN_FD names a
// listening TCP socket on `port`; else -1 (not under keel launch, or not rank 0's port).
int InheritedStoreSocket(int port);

// Writes "<event> <rank>\n" to the launcher's status pipe, when there is one. Never blocks and
// never fails: without a launcher listening it does nothing.
void TellLauncher(const std::string& event, int rank);

}  // namespace keel
