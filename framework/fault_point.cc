#include "framework/fault_point.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "framework/error.h"

namespace keel {

void FaultPoint(const char* name) {
  const char* want = std::getenv("KEEL_FAULT_POINT");
  if (want == nullptr || *want == '\0') return;
  std::string w(want);
  size_t at = w.find('@');
  if (w.compare(0, at, name) != 0 || std::strlen(name) != (at == std::string::npos ? w.size() : at))
    return;
  if (at != std::string::npos) {
    const char* rank = std::getenv("RANK");
    if (rank == nullptr) rank = std::getenv("PADDLE_TRAINER_ID");
    if (rank == nullptr || w.substr(at + 1) != rank) return;
  }
  ::kill(::getpid(), SIGKILL);
}

void FaultDelay(const std::string& name) {
  const char* want = std::getenv("KEEL_FAULT_DELAY");
  if (want == nullptr || *want == '\0') return;
  const char* rank = std::getenv("RANK");
  if (rank == nullptr) rank = std::getenv("PADDLE_TRAINER_ID");
  if (rank == nullptr) return;
  const std::string me = name + "@" + rank + ":";
  const std::string list = std::string(",") + want;
  const size_t at = list.find("," + me);
  if (at == std::string::npos) return;
  char* end = nullptr;
  const long ms = std::strtol(list.c_str() + at + 1 + me.size(), &end, 10);
  if (*end != '@') {
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return;
  }
  // "name@rank:ms@PATH": until PATH exists, at most ms.
  const size_t from = static_cast<size_t>(end + 1 - list.c_str());
  const std::string path = list.substr(from, list.find(',', from) - from);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (::access(path.c_str(), F_OK) != 0) {
    KEEL_ENFORCE(std::chrono::steady_clock::now() < deadline, "KEEL_FAULT_DELAY ", name, ": ", path,
                 " did not appear within ", ms, " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace keel
