#include "python_free_cli/launch_sentinel.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <vector>

#include "framework/base/fd_io.h"
#include "framework/error.h"

namespace keel {
namespace cli {

void Sentinel::Start(int close_fd) {
  int fds[2];
  PCHECK(pipe2(fds, O_CLOEXEC) == 0);
  pid_t pid = fork();
  PCHECK(pid >= 0);
  if (pid == 0) {
    close(fds[1]);
    if (close_fd >= 0) close(close_fd);
    setpgid(0, 0);  // out of the terminal's way: Ctrl-C reaches the launcher, not this
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    std::vector<pid_t> groups;
    std::string line;
    char c;
    while (true) {
      ssize_t n = read(fds[0], &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (c != '\n') {
        line += c;
        continue;
      }
      if (line == "bye") _exit(0);
      pid_t g = static_cast<pid_t>(std::atoi(line.c_str() + 1));
      if (line[0] == '+') groups.push_back(g);
      if (line[0] == '-') groups.erase(std::remove(groups.begin(), groups.end(), g), groups.end());
      line.clear();
    }
    for (pid_t g : groups) {
      kill(-g, SIGKILL);
      kill(-g, SIGCONT);
    }
    _exit(0);
  }
  close(fds[0]);
  pid_ = pid;
  fd_ = fds[1];
}

void Sentinel::Watch(pid_t group) { Tell(StrCat("+", group)); }

void Sentinel::Forget(pid_t group) { Tell(StrCat("-", group)); }

void Sentinel::Tell(const std::string& line) {
  if (fd_ >= 0) WriteAll(fd_, (line + "\n").data(), line.size() + 1);
}

void Sentinel::Stop() {
  Tell("bye");
  close(fd_);
  fd_ = -1;
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
}

}  // namespace cli
}  // namespace keel
