// POSIX helpers of keel launch: signal names, files opened above stdio, the tail of a log, the
// processes of a process group (from /proc), free ports, PATH lookup, the cores this process may
// use, random tokens (LaunchHost, launch_plan.h, is made of these four in launch.cc), and the
// store's listening socket and status pipes the supervisor hands its workers.
#pragma once

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

namespace keel {
namespace cli {

// "SIGKILL" for SIGKILL, ...; "signal" for a signal it does not name.
const char* SignalName(int sig);

// The last `n` lines of a file (reading at most its last 64 KiB); "" when it cannot be read.
std::string LogTail(const std::string& path, int n);

// open(2) with O_CLOEXEC, the fd moved above 2 so that dup2 onto stdio in a child never meets
// itself; a keel::Error naming the path when it cannot be opened.
int OpenHigh(const std::string& path, int flags, mode_t mode = 0644);

// A process and its state letter ('R', 'S', 'T', 'Z', ...).
struct ProcState {
  char state;
  pid_t pid, pgrp;
};
// Every process of the process groups `groups`, read from /proc.
std::vector<ProcState> ProcessesOfGroups(const std::set<pid_t>& groups);

// `count` distinct ports that are free on this node now (bound together, then released), none
// of them `exclude`.
std::vector<int> FreePorts(int count, int exclude);

// `cmd` as execve needs it: a path with a '/' as is, else the first executable in `path` (PATH's
// value; nullptr: unset, /usr/local/bin:/usr/bin:/bin). A keel::Error saying why there is none.
std::string ResolveExecutable(const std::string& cmd, const char* path);

// The CPUs this process may run on (its affinity mask).
int CpuCount();
// Their ids, in increasing order.
std::vector<int> AffinityCpus();

// 32 random hex digits (from /dev/urandom).
std::string RandomToken();

// A TCP socket listening on host:port (the loopback interface when `loopback_only`, else every
// interface), close-on-exec and numbered above 2. A keel::Error naming the endpoint, and saying
// that another process holds the port when it does, when it cannot listen.
int ListenOn(const std::string& host, int port, bool loopback_only);

// A pipe whose ends are close-on-exec and numbered above 2; fds[0] reads (nonblocking).
void PipeAboveStdio(int fds[2]);

}  // namespace cli
}  // namespace keel
