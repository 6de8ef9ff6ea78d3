// Background processes for fault tests: start a shell command with its output in a file, wait
// for text in that file, find a job's worker by rank, and make sure nothing outlives a test.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace keel::testing {

struct Background {
  pid_t pid = -1;  // the command itself (exec'ed by sh), leader of its own process group
  std::string output_path;
};

// Runs `cmd` under `sh -c 'exec cmd'` in a new process group, stdout and stderr to
// `output_path`.
Background StartBackground(const std::string& cmd, const std::string& output_path);
// Waits up to `timeout_s` for `pid` to exit; returns its wait status, or -1 after killing its
// whole process group when it did not exit in time.
int WaitFor(pid_t pid, double timeout_s);
// Waits up to `timeout_s` until `path` contains `text` (ReadText, files.h).
bool WaitForText(const std::string& path, const std::string& text, double timeout_s);
// Pids of the processes whose environment holds `env_entry` (e.g. "KEEL_TEST_MARK=x") and, when
// `rank` >= 0, RANK=rank, and whose command name (comm) is `comm` unless that is empty.
std::vector<pid_t> FindProcesses(const std::string& env_entry, int rank = -1,
                                 const std::string& comm = "");
// Kills (SIGKILL) every process FindProcesses(env_entry) finds; returns how many there were.
int KillAll(const std::string& env_entry);
// A mark unique to this test run, for KEEL_TEST_MARK.
std::string UniqueMark(const std::string& test);

}  // namespace keel::testing
