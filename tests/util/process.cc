#include "tests/util/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tests/util/files.h"

namespace keel::testing {

Background StartBackground(const std::string& cmd, const std::string& output_path) {
  Background b;
  b.output_path = output_path;
  std::string full = "exec " + cmd;
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    int fd = open(output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execl("/bin/sh", "sh", "-c", full.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(pid, pid);
  b.pid = pid;
  return b;
}

int WaitFor(pid_t pid, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-pid, SIGKILL);
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

bool WaitForText(const std::string& path, const std::string& text, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (ReadText(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::vector<pid_t> FindProcesses(const std::string& env_entry, int rank, const std::string& comm) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  const std::string rank_entry = "RANK=" + std::to_string(rank);
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    std::string base = std::string("/proc/") + e->d_name;
    std::ifstream env_file(base + "/environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(env_file)), std::istreambuf_iterator<char>());
    bool has_mark = false, has_rank = rank < 0;
    size_t start = 0;
    while (start < env.size()) {
      size_t end = env.find('\0', start);
      if (end == std::string::npos) end = env.size();
      std::string entry = env.substr(start, end - start);
      has_mark = has_mark || entry == env_entry;
      has_rank = has_rank || entry == rank_entry;
      start = end + 1;
    }
    if (!has_mark || !has_rank) continue;
    if (!comm.empty()) {
      std::string c = ReadText(base + "/comm");
      while (!c.empty() && c.back() == '\n') c.pop_back();
      if (c != comm) continue;
    }
    // A zombie still shows its environment? No: environ of a zombie reads empty. Skip ours.
    if (pid != getpid()) out.push_back(pid);
  }
  closedir(d);
  return out;
}

int KillAll(const std::string& env_entry) {
  std::vector<pid_t> pids = FindProcesses(env_entry);
  for (pid_t p : pids) kill(p, SIGKILL);
  return static_cast<int>(pids.size());
}

std::string UniqueMark(const std::string& test) {
  std::random_device rd;
  return test + "_" + std::to_string(getpid()) + "_" + std::to_string(rd() % 1000000);
}

}  // namespace keel::testing
