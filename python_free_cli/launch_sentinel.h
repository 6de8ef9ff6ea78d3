// keel launch's sentinel: a small child process that outlives a SIGKILL of the launcher. The
// launcher tells it each worker's process group through a pipe only the launcher holds; when the
// pipe reaches end of file without a goodbye (the launcher died), it kills every group it was
// told of, so no worker (nor a worker's child, e.g. under an `sh -c` wrapper) is left training as
// an orphan.
#pragma once

#include <sys/types.h>

#include <string>

namespace keel {
namespace cli {

class Sentinel {
 public:
  // Forks the sentinel, which closes its copy of `close_fd` (when >= 0): a socket the launcher
  // holds that the sentinel must not keep open should it outlive the launcher.
  void Start(int close_fd = -1);
  // Process group `group` is to be killed if the launcher dies.
  void Watch(pid_t group);
  // Group `group` is empty: its id may be reused, so the sentinel must forget it.
  void Forget(pid_t group);
  // Says goodbye (the sentinel exits killing nothing) and reaps it.
  void Stop();

  pid_t pid() const { return pid_; }
  // The launcher has reaped the sentinel itself (waitpid(-1) while reaping the workers' orphans).
  void Reaped() { pid_ = -1; }

 private:
  void Tell(const std::string& line);

  pid_t pid_ = -1;
  int fd_ = -1;  // the pipe's write end
};

}  // namespace cli
}  // namespace keel
