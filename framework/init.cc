#include "framework/init.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "framework/error.h"
#include "framework/runtime/blas.h"

extern char** environ;

DEFINE_int32(cpu_math_threads, 0,
             "Threads the CPU BLAS (GEMM) may use per process; 0 means one per core.");

namespace keel {

int ApplyFlagsFromEnv() {
  int applied = 0;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "FLAGS_", 6) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    std::string name(*e + 6, static_cast<size_t>(eq - (*e + 6)));
    std::string value(eq + 1);
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      LOG(WARNING) << "environment variable FLAGS_" << name << " names no keel flag; ignored";
      continue;
    }
    if (!info.is_default) continue;  // the command line wins
    std::string result = gflags::SetCommandLineOption(name.c_str(), value.c_str());
    KEEL_ENFORCE(!result.empty(), "environment variable FLAGS_", name, "='", value,
                 "' is not a valid ", info.type, " value");
    ++applied;
  }
  return applied;
}

void Init(int* argc, char*** argv) {
  // Line by line even into a file or pipe (a worker's log): what a process printed before it
  // crashed is in the log, not lost in a buffer. Before any output, as setvbuf requires.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  gflags::ParseCommandLineFlags(argc, argv, true);
  static bool glog_ready = false;
  if (!glog_ready) {
    FLAGS_logtostderr = FLAGS_logtostderr || std::getenv("GLOG_log_dir") == nullptr;
    google::InitGoogleLogging((*argv)[0]);
    // A crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) prints the signal and a stack trace to
    // stderr, then dies of the signal as before. SIGTERM, which glog handles too, is how
    // `keel launch` stops healthy workers: it keeps its default action, without a trace.
    struct sigaction term;
    sigaction(SIGTERM, nullptr, &term);
    google::InstallFailureSignalHandler();
    sigaction(SIGTERM, &term, nullptr);
    glog_ready = true;
  }
  ApplyFlagsFromEnv();
  KEEL_ENFORCE(FLAGS_cpu_math_threads >= 0, "--cpu_math_threads must be >= 0, got ",
               FLAGS_cpu_math_threads);
  if (FLAGS_cpu_math_threads == 0)
    FLAGS_cpu_math_threads = std::max(1u, std::thread::hardware_concurrency());
  blas::SetNumThreads(FLAGS_cpu_math_threads);
}

}  // namespace keel
