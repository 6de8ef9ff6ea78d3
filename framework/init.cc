#include "framework/init.h"

#include <gflags/gflags.h>
#include <glog/logging.h>
#include <sched.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "framework/base/strings.h"
#include "framework/error.h"
#include "framework/profiler/profiler.h"
#include "framework/runtime/cpu_threads.h"

extern char** environ;

DEFINE_int32(cpu_math_threads, 0,
             "CPU threads per process, shared by the executor's workers and the kernels' intra-op "
             "work; 0: this process's share of its CPUs (divided among the node's workers that "
             "LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE or SLURM_NTASKS_PER_NODE announce).");

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

namespace {

// This process's share of the CPUs it may run on: the affinity mask's CPUs divided by the workers
// on this node that the environment announces (keel launch and torchrun's LOCAL_WORLD_SIZE,
// mpirun's OMPI_COMM_WORLD_LOCAL_SIZE, srun's SLURM_NTASKS_PER_NODE), as keel launch divides
// them. A scheduler that binds each rank to its own cores (mpirun's default --bind-to core)
// leaves a narrow mask, and the share is at least one thread.
struct CpuShare {
  int cpus = 1, local = 1;
  std::string from;  // the variable that announced `local`
};

CpuShare ThisProcessesShare() {
  CpuShare share;
  cpu_set_t set;
  share.cpus = sched_getaffinity(0, sizeof(set), &set) == 0
                   ? CPU_COUNT(&set)
                   : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (const char* var :
       {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = std::getenv(var);
    if (v == nullptr) continue;
    int n = std::atoi(v);
    if (n > 0) {
      share.local = n;
      share.from = var;
      break;
    }
  }
  return share;
}

int DefaultMathThreads() {
  const CpuShare share = ThisProcessesShare();
  int threads = std::max(1, share.cpus / share.local);
  if (share.local > 1)
    LOG(INFO) << "cpu_math_threads=" << threads << " (" << share.cpus << " CPU(s) for "
              << share.local << " workers on this node, " << share.from << ")";
  return threads;
}

}  // namespace

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
  // keel launch passes the flags given to it as FLAGS_ variables and names them here: a program
  // that does not define one would ignore it, so it refuses to start.
  if (const char* names = std::getenv("KEEL_LAUNCH_FLAGS")) {
    for (const std::string& name : StrSplit(names, ',')) {
      gflags::CommandLineFlagInfo info;
      KEEL_ENFORCE(name.empty() || gflags::GetCommandLineFlagInfo(name.c_str(), &info),
                   "keel launch was given --", name, " for its workers, but ", (*argv)[0],
                   " defines no flag --", name, "; pass it only to programs that read it");
    }
  }
  profiler::StartFromFlagsUntilExit();
  KEEL_ENFORCE(FLAGS_cpu_math_threads >= 0, "--cpu_math_threads must be >= 0, got ",
               FLAGS_cpu_math_threads);
  if (FLAGS_cpu_math_threads == 0) FLAGS_cpu_math_threads = DefaultMathThreads();
  const CpuShare share = ThisProcessesShare();
  cpu_threads::SetBudget(FLAGS_cpu_math_threads,
                         cpu_threads::ShouldSpin(FLAGS_cpu_math_threads, share.local, share.cpus));
}

}  // namespace keel
