// keel launch's supervisor: starts this node's workers as the plan says and watches them. Rank
// 0's output is copied to the console, every worker's goes to LOG_DIR/workerlog.N, a failing
// worker stops all the others (or, with --max_restarts, all are started again) and is named with
// the tail of its log, a worker stopped (state T) too long fails the job, a worker that exits 0
// before joining the rendezvous while its peers wait there fails it too, and SIGINT/SIGTERM/
// SIGHUP are forwarded.
//
// The launcher that starts rank 0 listens on rank 0's port before any worker starts, holds it
// until the job ends and serves the rendezvous store there itself, one store per attempt (of that
// restart generation), as torchrun's agent does: the store outlives every worker (a rank 0 that
// finishes first leaves its peers their store), and between a failed attempt and its restart no
// other process can take the port and pose as the store. A port that is taken before the job
// starts is an error naming it, and no worker is started. Every worker also gets a status pipe
// (KEEL_LAUNCH_STATUS_FD) on which its rendezvous says when it starts and when the rank has
// joined, and the workers of rank 0's node the store's port (KEEL_LAUNCH_STORE_PORT), so that
// rank 0 does not serve one of its own (framework/comm/launch_channel.h).
//
// Process layout: every worker is its own process group (so the launcher can signal a worker's
// whole tree, e.g. `sh -c '...; sleep 30'`, and a terminal's Ctrl-C reaches the workers exactly
// once, through the launcher); workers die with the launcher (PR_SET_PDEATHSIG), and the sentinel
// (launch_sentinel.h) kills them should the launcher be killed. The launcher's supervision is one
// thread: signals are blocked (in the store's threads too) and read from a signalfd in the same
// poll() as rank 0's pipe; a child makes only async-signal-safe calls between fork and exec.
#include "python_free_cli/launch_supervisor.h"

#include <fcntl.h>
#include <glog/logging.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "framework/base/fd_io.h"
#include "framework/base/strings.h"
#include "framework/comm/store.h"
#include "framework/error.h"
#include "python_free_cli/launch_sentinel.h"
#include "python_free_cli/process_util.h"

namespace keel {
namespace cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

struct Worker {
  int local = 0, rank = 0;
  pid_t pid = -1;  // also its process group id
  bool alive = false;
  int status = 0;
  bool reaped_after_kill = false;  // it may have died of the launcher's own SIGKILL
  std::string log_path;
  std::string role;  // parameter-server mode: "server 1", "trainer 0"
  int log_fd = -1;
  // When a process of its group was first seen stopped (state T or t), if it still is.
  bool stopped = false, stopped_logged = false;
  Clock::time_point stopped_since;
  double stopped_for_s = 0;  // how long it had been stopped when the job failed
  bool stopped_too_long = false;
  // Its rendezvous, as its status pipe tells (launch_channel.h).
  int status_fd = -1;  // the pipe's read end
  std::string status_buf;
  bool in_rendezvous = false, joined = false;
  bool exited_unjoined = false;  // it exited 0 without having joined the rendezvous
  bool left_early = false;       // ... while peers waited there: the job's failure
  std::string waiting;           // those peers' ranks
};

class Supervisor {
 public:
  explicit Supervisor(const LaunchPlan& plan) : plan_(plan) {}

  int Run() {
    // Rank 0's port is the job's from now on (see the top of this file).
    if (!plan_.workers.empty() && plan_.workers[0].rank == 0) {
      const size_t colon = plan_.master.rfind(':');
      const std::string host = plan_.master.substr(0, colon);
      store_fd_ = ListenOn(host, std::atoi(plan_.master.c_str() + colon + 1),
                           (host == "127.0.0.1" || host == "localhost") && plan_.nnodes == 1);
    }
    std::filesystem::path dir(plan_.log_dir);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    KEEL_ENFORCE(!ec, "--log_dir=", plan_.log_dir, ": cannot create it: ", ec.message());
    BlockSignals();
    // Orphans of a worker (`sh -c 'x & wait'`) become the launcher's children, not init's.
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    for (const LaunchWorker& planned : plan_.workers) {
      Worker w;
      w.local = planned.local;
      w.rank = planned.rank;
      w.log_path = planned.log_path;
      w.role = planned.role;
      w.log_fd = OpenHigh(w.log_path, O_WRONLY | O_CREAT | O_TRUNC);
      workers_.push_back(w);
    }
    sentinel_.Start(store_fd_);
    std::fprintf(
        stderr,
        "keel launch: %d worker(s), ranks %d..%d of %d, rank 0 at %s; logs in %s/workerlog.N\n",
        plan_.nproc_per_node, plan_.workers.front().rank, plan_.workers.back().rank, plan_.world(),
        plan_.master.c_str(), plan_.log_dir.c_str());
    for (int attempt = 0;; ++attempt) {
      restart_ = attempt;
      ServeStore();
      for (Worker& w : workers_) Spawn(&w);
      Monitor();
      store_.reset();  // every worker of the attempt is gone
      const Worker* cause = RootCause();
      if (cause != nullptr && stop_signal_ == 0 && attempt < plan_.max_restarts) {
        std::fprintf(stderr, "keel launch: restart %d of %d: %s; restarting all %zu worker(s)\n",
                     attempt + 1, plan_.max_restarts, Describe(*cause).c_str(), workers_.size());
        for (Worker& w : workers_) {
          std::string mark = StrCat("---- keel launch: restart ", attempt + 1, " of ",
                                    plan_.max_restarts, " (", Describe(*cause), ") ----\n");
          WriteAll(w.log_fd, mark.data(), mark.size());
        }
        ResetAttempt();
        continue;
      }
      int rc = Report();
      for (Worker& w : workers_) close(w.log_fd);
      sentinel_.Stop();
      if (store_fd_ >= 0) close(store_fd_);
      return rc;
    }
  }

 private:
  // SIGCHLD and the forwarded signals arrive through a signalfd; SIGPIPE is blocked so that a
  // closed console gives EPIPE instead of killing the launcher. A signal the launcher inherited
  // as ignored (nohup, `&` in a script) stays ignored.
  void BlockSignals() {
    sigset_t handled, blocked;
    sigemptyset(&handled);
    sigaddset(&handled, SIGCHLD);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old;
      sigaction(sig, nullptr, &old);
      if (old.sa_handler != SIG_IGN) sigaddset(&handled, sig);
    }
    blocked = handled;
    sigaddset(&blocked, SIGPIPE);
    PCHECK(sigprocmask(SIG_BLOCK, &blocked, &old_mask_) == 0);
    signal_fd_ = signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
    PCHECK(signal_fd_ >= 0);
  }

  // This attempt's store on rank 0's port, of its restart generation, when this node runs rank 0.
  void ServeStore() {
    if (store_fd_ < 0) return;
    const int fd = fcntl(store_fd_, F_DUPFD_CLOEXEC, 3);  // the store closes its copy at the end
    PCHECK(fd >= 0);
    // Host and port are the socket's (the store reads them from it).
    store_ = std::make_unique<StoreServer>("", 0, plan_.token, restart_, fd);
  }

  void Spawn(Worker* w) {
    std::vector<std::string> env;
    for (const std::string& e : plan_.workers[w->local].env)  // a launcher's own, if any
      if (e.rfind("KEEL_LAUNCH_STORE_PORT=", 0) != 0 && e.rfind("KEEL_LAUNCH_STATUS_FD=", 0) != 0)
        env.push_back(e);
    env.push_back(StrCat("KEEL_RESTART_COUNT=", restart_));
    env.push_back(StrCat("TORCHELASTIC_RESTART_COUNT=", restart_));
    int status[2];
    PipeAboveStdio(status);
    w->status_fd = status[0];
    struct stat pipe_st;
    fstat(status[1], &pipe_st);  // its inode tells the worker the fd is this very pipe
    env.push_back(StrCat("KEEL_LAUNCH_STATUS_FD=", status[1], ":", pipe_st.st_ino));
    if (store_ != nullptr) env.push_back(StrCat("KEEL_LAUNCH_STORE_PORT=", store_->port()));
    std::vector<char*> argv, envp;
    for (const std::string& a : plan_.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    // Written by the child with write(2) only, if execve fails.
    std::string exec_error = "keel launch: cannot execute '" + plan_.executable + "': ";
    // Built here: the child only calls async-signal-safe functions between fork and execve.
    const std::vector<int>& cpus = plan_.workers[w->local].cpus;
    const bool bound = !cpus.empty();
    std::vector<cpu_set_t> bind(
        bound ? static_cast<size_t>(*std::max_element(cpus.begin(), cpus.end()) / CPU_SETSIZE + 1)
              : 1);
    const size_t bind_bytes = bind.size() * sizeof(cpu_set_t);
    CPU_ZERO_S(bind_bytes, bind.data());
    for (int c : cpus) CPU_SET_S(c, bind_bytes, bind.data());
    const std::string bind_error = StrCat("keel launch: this worker could not be bound to CPUs ",
                                          StrJoin(plan_.workers[w->local].cpus, ","),
                                          " (--cpu_bind=cores): ", "it runs unbound\n");
    const std::string sched_error =
        "keel launch: this worker could not be put under SCHED_BATCH (--cpu_sched); it runs "
        "under the normal policy\n";

    int out_fd = w->log_fd;  // rank 0 (local 0) writes to a pipe that the launcher tees
    if (w->local == plan_.console_local) {
      int fds[2];
      PCHECK(pipe2(fds, O_CLOEXEC) == 0);
      pipe_fd_ = fds[0];
      out_fd = fds[1];
      fcntl(pipe_fd_, F_SETFL, O_NONBLOCK);
    }
    int null_fd = OpenHigh("/dev/null", O_RDONLY);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      int err = errno;
      SignalAll(SIGKILL);
      for (Worker& other : workers_)
        if (other.alive) waitpid(other.pid, nullptr, 0);
      KEEL_THROW("cannot start worker local rank ", w->local, ": fork: ", std::strerror(err));
    }
    if (pid == 0) {
      // The one descriptor this worker inherits (the others' are close-on-exec).
      fcntl(status[1], F_SETFD, 0);
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // the launcher died before prctl
      dup2(null_fd, 0);
      dup2(out_fd, 1);
      dup2(out_fd, 2);
      sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      if (bound && sched_setaffinity(0, bind_bytes, bind.data()) != 0)
        WriteAll(2, bind_error.data(), bind_error.size());
      if (plan_.sched_batch) {
        struct sched_param none = {};
        if (sched_setscheduler(0, SCHED_BATCH, &none) != 0)
          WriteAll(2, sched_error.data(), sched_error.size());
      }
      execve(plan_.executable.c_str(), argv.data(), envp.data());
      int err = errno;
      const char* why = err == ENOENT    ? "No such file or directory"
                        : err == EACCES  ? "Permission denied"
                        : err == ENOEXEC ? "Exec format error (no #! line?)"
                        : err == E2BIG   ? "Argument list too long"
                                         : "exec failed";
      WriteAll(2, exec_error.data(), exec_error.size());
      WriteAll(2, why, std::strlen(why));
      WriteAll(2, "\n", 1);
      _exit(err == ENOENT ? 127 : 126);
    }
    setpgid(pid, pid);  // also here, so the group exists before the launcher ever signals it
    sentinel_.Watch(pid);
    close(null_fd);
    close(status[1]);
    if (w->local == plan_.console_local) close(out_fd);
    w->pid = pid;
    w->alive = true;
  }

  void SignalAll(int sig) {
    for (const Worker& w : workers_)
      if (w.pid > 0) kill(-w.pid, sig);  // the worker's whole process group
  }

  void Stop(int sig) {
    stopping_ = true;
    settling_ = false;
    deadline_ = Clock::now() + std::chrono::seconds(plan_.grace_period_s);
    SignalAll(sig);
    SignalAll(SIGCONT);  // a stopped worker acts on the signal only once it runs
  }

  // A worker failed: its peers get kSettle to end by themselves before SIGTERM. Peers that failed
  // with it (a decision all ranks take together, such as "no rank has a readable checkpoint")
  // then print why instead of dying of the launcher's signal half a millisecond too early; a
  // peer still waiting on the failed one is stopped kSettle later than before.
  static constexpr std::chrono::milliseconds kSettle{500};
  void StopAfterSettling() {
    stopping_ = settling_ = true;
    settle_until_ = Clock::now() + kSettle;
    deadline_ = settle_until_ + std::chrono::seconds(plan_.grace_period_s);
  }

  // Reaps workers and the orphans they left (the launcher is their subreaper).
  void Reap() {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (Worker& w : workers_) {
        if (!w.alive || w.pid != pid) continue;
        w.alive = false;
        w.status = status;
        w.reaped_after_kill = killed_;
        // Once its group is empty its id may be reused: the sentinel must forget it.
        if (kill(-w.pid, 0) != 0 && errno == ESRCH) sentinel_.Forget(w.pid);
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        PumpStatus(&w);  // all it said before it exited
        if (!ok && !stopping_) {
          first_failed_ = &w;
          NoteStoppedAtFailure();
          StopAfterSettling();
        } else if (ok && !stopping_ && !w.joined) {
          w.exited_unjoined = true;
          CheckLeftEarly();
        }
      }
    }
  }

  // Reads what `w`'s rendezvous said on its status pipe ("rendezvous R", "joined R"), then checks
  // whether a worker left its peers waiting.
  void PumpStatus(Worker* w) {
    while (w->status_fd >= 0) {
      char buf[512];
      ssize_t n = read(w->status_fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;  // EAGAIN: nothing more now
      if (n == 0) {
        close(w->status_fd);
        w->status_fd = -1;
        break;
      }
      w->status_buf.append(buf, static_cast<size_t>(n));
    }
    for (size_t nl; (nl = w->status_buf.find('\n')) != std::string::npos;) {
      const std::string event = w->status_buf.substr(0, w->status_buf.find(' '));
      w->status_buf.erase(0, nl + 1);
      if (event == "rendezvous") w->in_rendezvous = true;
      if (event == "joined") w->in_rendezvous = w->joined = true;
    }
    if (w->status_buf.size() > 4096) w->status_buf.clear();  // not ours: no line in sight
    CheckLeftEarly();
  }

  // A worker that exited 0 without joining the rendezvous while a peer is in it: the peer would
  // wait for it until the comm timeout and then be blamed. It is the job's failure, now.
  void CheckLeftEarly() {
    if (stopping_) return;
    for (Worker& e : workers_) {
      if (!e.exited_unjoined) continue;
      std::vector<int> waiting;
      for (const Worker& o : workers_)
        if (&o != &e && o.alive && o.in_rendezvous) waiting.push_back(o.rank);
      if (waiting.empty()) continue;
      e.left_early = true;
      e.waiting = StrJoin(waiting, ", ");
      first_failed_ = &e;
      NoteStoppedAtFailure();
      Stop(SIGTERM);
      return;
    }
  }

  // A worker whose process group has a stopped process (SIGSTOP, a debugger) makes its peers
  // wait in their collectives: it is named as soon as it is seen, blamed if the job then fails,
  // and failed itself once it has been stopped longer than the peers' comm timeout.
  void CheckStopped() {
    std::set<pid_t> groups;
    for (const Worker& w : workers_)
      if (w.alive) groups.insert(w.pid);
    if (groups.empty()) return;
    std::set<pid_t> stopped_groups;
    std::map<pid_t, pid_t> stopped_pid;
    for (const ProcState& p : ProcessesOfGroups(groups)) {
      if (p.state != 'T' && p.state != 't') continue;
      stopped_groups.insert(p.pgrp);
      stopped_pid[p.pgrp] = p.pid;
    }
    const auto now = Clock::now();
    for (Worker& w : workers_) {
      bool is_stopped = w.alive && stopped_groups.count(w.pid);
      if (is_stopped && !w.stopped) {
        w.stopped = true;  // a suspect from now on; named once seen stopped twice in a row
        w.stopped_since = now;
      } else if (is_stopped && !w.stopped_logged) {
        w.stopped_logged = true;
        std::fprintf(stderr,
                     "keel launch: worker rank %d (local %d, pid %d) is stopped (state T: "
                     "SIGSTOP, Ctrl-Z or a debugger?); the other ranks wait for it\n",
                     w.rank, w.local, static_cast<int>(stopped_pid[w.pid]));
      } else if (!is_stopped && w.stopped) {
        w.stopped = false;
        bool was_logged = w.stopped_logged;
        w.stopped_logged = false;
        if (w.alive && was_logged)
          std::fprintf(
              stderr, "keel launch: worker rank %d runs again after %s s stopped\n", w.rank,
              Seconds(std::chrono::duration<double>(now - w.stopped_since).count()).c_str());
      }
      const double limit = plan_.stopped_limit_s;
      if (w.stopped && !stopping_ &&
          std::chrono::duration<double>(now - w.stopped_since).count() > limit) {
        w.stopped_too_long = true;
        w.stopped_for_s = std::chrono::duration<double>(now - w.stopped_since).count();
        std::fprintf(stderr,
                     "keel launch: worker rank %d has been stopped for %.0f s, longer than the "
                     "comm timeout (%.0f s); stopping the job\n",
                     w.rank, w.stopped_for_s, limit);
        first_failed_ = &w;
        Stop(SIGTERM);
        SignalAll(SIGKILL);  // a stopped process cannot act on SIGTERM in time
        killed_ = true;
      }
    }
  }

  // When a worker fails, every worker stopped at that moment is a suspect: its peers may have
  // timed out waiting for it.
  void NoteStoppedAtFailure() {
    const auto now = Clock::now();
    for (Worker& w : workers_)
      if (w.stopped) w.stopped_for_s = std::chrono::duration<double>(now - w.stopped_since).count();
  }

  void OnSignals() {
    signalfd_siginfo si;
    while (read(signal_fd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      int sig = static_cast<int>(si.ssi_signo);
      if (sig == SIGCHLD) {
        Reap();
      } else if (!stopping_) {
        std::fprintf(stderr, "keel launch: got %s, forwarding it to the workers\n",
                     SignalName(sig));
        stop_signal_ = sig;
        Stop(sig);
      } else if (!killed_) {
        std::fprintf(stderr, "keel launch: got %s while stopping, killing the workers\n",
                     SignalName(sig));
        if (stop_signal_ == 0) stop_signal_ = sig;
        SignalAll(SIGKILL);
        killed_ = true;
      }
    }
  }

  // Copies what rank 0 (the console worker: trainer 0 in parameter-server mode) wrote to its log
  // and to the console; false at end of file.
  bool PumpRank0() {
    char buf[65536];
    ssize_t n = read(pipe_fd_, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
    if (n <= 0) {
      close(pipe_fd_);
      pipe_fd_ = -1;
      return false;
    }
    WriteAll(workers_[plan_.console_local].log_fd, buf, static_cast<size_t>(n));
    if (console_ok_) console_ok_ = WriteAll(STDOUT_FILENO, buf, static_cast<size_t>(n));
    return true;
  }

  bool AnyAlive() const {
    return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.alive; });
  }

  void Monitor() {
    Reap();  // a worker may have exited before the first poll
    auto next_check = Clock::now() + std::chrono::seconds(1);
    while (AnyAlive()) {
      int64_t timeout =
          std::chrono::duration_cast<std::chrono::milliseconds>(next_check - Clock::now()).count();
      if (stopping_ && !killed_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            (settling_ ? settle_until_ : deadline_) - Clock::now());
        timeout = std::min<int64_t>(timeout, left.count());
      }
      // poll ignores the entries of closed pipes (fd -1).
      std::vector<pollfd> fds = {{signal_fd_, POLLIN, 0}, {pipe_fd_, POLLIN, 0}};
      for (const Worker& w : workers_) fds.push_back({w.status_fd, POLLIN, 0});
      int n = poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(0, timeout)));
      PCHECK(n >= 0 || errno == EINTR);
      if (n > 0 && fds[0].revents) OnSignals();
      if (n > 0 && pipe_fd_ >= 0 && fds[1].revents) PumpRank0();
      for (size_t i = 0; n > 0 && i < workers_.size(); ++i)
        if (fds[2 + i].revents) PumpStatus(&workers_[i]);
      if (Clock::now() >= next_check) {
        // Also reaps here: should a SIGCHLD ever not reach the signalfd (one CI run hung once
        // with an exited worker, unexplained), the job still ends within a second.
        Reap();
        CheckStopped();
        next_check = Clock::now() + std::chrono::seconds(1);
      }
      if (settling_ && Clock::now() >= settle_until_ && AnyAlive()) Stop(SIGTERM);
      if (stopping_ && !killed_ && Clock::now() >= deadline_) {
        std::fprintf(stderr, "keel launch: workers still running %ds after SIGTERM, killing them\n",
                     plan_.grace_period_s);
        SignalAll(SIGKILL);
        killed_ = true;
      }
    }
    // Children of a stopped worker may outlive it, holding its group and rank 0's pipe: kill
    // them and reap them, so that no process (not even a zombie) outlives a stopped job.
    if (stopping_) {
      SignalAll(SIGKILL);
      SignalAll(SIGCONT);
      auto until = Clock::now() + std::chrono::seconds(1);
      while (Clock::now() < until) {
        pid_t pid = waitpid(-1, nullptr, WNOHANG);
        if (pid > 0 && pid == sentinel_.pid()) sentinel_.Reaped();
        if (pid < 0) break;  // ECHILD: none left
        if (pid == 0) {
          bool any_left = false;
          for (const Worker& w : workers_) any_left = any_left || kill(-w.pid, 0) == 0;
          if (!any_left) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
      }
    }
    for (const Worker& w : workers_)
      if (kill(-w.pid, 0) != 0 && errno == ESRCH) sentinel_.Forget(w.pid);
    // Drain rank 0's output: to end of file, or until it has been quiet a moment (a daemon it
    // left behind may keep the pipe open).
    auto until = Clock::now() + std::chrono::seconds(2);
    while (pipe_fd_ >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) break;
      pollfd fd = {pipe_fd_, POLLIN, 0};
      if (poll(&fd, 1, static_cast<int>(std::min<int64_t>(200, left.count()))) <= 0) break;
      PumpRank0();
    }
    if (pipe_fd_ >= 0) close(pipe_fd_);
    pipe_fd_ = -1;
  }

  void ResetAttempt() {
    for (Worker& w : workers_) {
      w.pid = -1;
      w.alive = false;
      w.status = 0;
      w.reaped_after_kill = false;
      w.stopped = w.stopped_logged = false;
      w.stopped_for_s = 0;
      w.stopped_too_long = false;
      if (w.status_fd >= 0) close(w.status_fd);
      w.status_fd = -1;
      w.status_buf.clear();
      w.in_rendezvous = w.joined = false;
      w.exited_unjoined = w.left_early = false;
      w.waiting.clear();
    }
    stopping_ = killed_ = settling_ = false;
    first_failed_ = nullptr;
  }

  static std::string HowItEnded(int st) {
    return WIFEXITED(st) ? StrCat("exited with code ", WEXITSTATUS(st))
                         : StrCat("was killed by signal ", SignalName(WTERMSIG(st)), " (",
                                  WTERMSIG(st), ")", WCOREDUMP(st) ? ", core dumped" : "");
  }

  // "worker rank 1 (local 1, pid 123) was killed by signal SIGKILL (9)"
  std::string Describe(const Worker& w) const {
    std::string who = StrCat(w.role.empty() ? "worker" : w.role, " rank ", w.rank, " (local ",
                             w.local, ", pid ", w.pid, ")");
    if (w.left_early)
      return StrCat(who, " exited with code 0 before joining the job's rendezvous, while rank(s) ",
                    w.waiting,
                    " waited for it there (they would have waited until the comm timeout)");
    if (w.stopped_too_long)
      return StrCat(who, " was stopped (state T) for ", static_cast<int>(w.stopped_for_s),
                    " s, longer than the comm timeout");
    if (w.stopped_for_s > 0 && &w != first_failed_)
      return StrCat(who, " was stopped (state T) for ", Seconds(w.stopped_for_s),
                    " s when the job failed; the other ranks waited for it");
    return StrCat(who, " ", HowItEnded(w.status));
  }

  // Whether a signal that nobody in the job sent (kill -9, the OOM killer, a crash) ended `w`.
  // SIGPIPE is a dead peer's echo, SIGTERM (or the forwarded signal) and the final SIGKILL are
  // the launcher's own.
  bool DiedOfOutsideSignal(const Worker& w) const {
    if (!WIFSIGNALED(w.status)) return false;
    int sig = WTERMSIG(w.status);
    if (sig == SIGPIPE) return false;
    if (stopping_ && (sig == SIGTERM || sig == stop_signal_)) return false;
    if (sig == SIGKILL && w.reaped_after_kill) return false;
    return true;
  }

  // The worker whose failure started the stop. A worker that was stopped when the job failed is
  // the cause (its peers timed out waiting for it). When a worker is killed, a peer blocked in a
  // collective with it often fails (EPIPE, reset) at the same instant and may be reaped first;
  // the killed one is the cause and the peer's failure is its consequence.
  const Worker* RootCause() const {
    if (first_failed_ == nullptr) return nullptr;
    for (const Worker& w : workers_)
      if (w.stopped_too_long || (w.stopped_for_s > 0 && &w != first_failed_)) return &w;
    if (DiedOfOutsideSignal(*first_failed_)) return first_failed_;
    for (const Worker& w : workers_)
      if (&w != first_failed_ && !w.alive && DiedOfOutsideSignal(w)) return &w;
    return first_failed_;
  }

  int Report() {
    const Worker* cause = RootCause();
    if (cause != nullptr) {
      const Worker& w = *cause;
      int st = w.status;
      std::string tail = LogTail(w.log_path, 20);
      if (plan_.max_restarts > 0)
        std::fprintf(stderr, "keel launch: giving up after %d restart(s); the last failure:\n",
                     restart_);
      std::fprintf(stderr,
                   "keel launch: %s\n"
                   "keel launch: last 20 lines of %s:\n%s%s",
                   Describe(w).c_str(), w.log_path.c_str(),
                   tail.empty() ? "(empty)\n" : tail.c_str(),
                   !tail.empty() && tail.back() != '\n' ? "\n" : "");
      if (cause != first_failed_) {
        const Worker& f = *first_failed_;
        std::fprintf(stderr,
                     "keel launch: worker rank %d (local %d) failed too (%s), as a consequence; "
                     "its log is %s\n",
                     f.rank, f.local, HowItEnded(f.status).c_str(), f.log_path.c_str());
      }
      if (workers_.size() > 1)
        std::fprintf(stderr, "keel launch: stopped the other %zu worker(s)\n", workers_.size() - 1);
      if (w.stopped_for_s > 0 && !(WIFEXITED(st) && WEXITSTATUS(st) != 0)) return 1;
      if (w.left_early) return 1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (stop_signal_ != 0) {
      std::fprintf(stderr, "keel launch: stopped %zu worker(s) after %s\n", workers_.size(),
                   SignalName(stop_signal_));
      return 128 + stop_signal_;
    }
    return 0;
  }

  const LaunchPlan& plan_;
  std::vector<Worker> workers_;
  sigset_t old_mask_;
  int signal_fd_ = -1;
  int pipe_fd_ = -1;  // rank 0's stdout+stderr
  bool console_ok_ = true;
  bool stopping_ = false, killed_ = false;
  bool settling_ = false;  // a worker failed; the others are signalled at settle_until_
  Clock::time_point deadline_, settle_until_;
  const Worker* first_failed_ = nullptr;
  int stop_signal_ = 0;                 // the signal that stopped the job, if one did
  int restart_ = 0;                     // this attempt's restart count
  int store_fd_ = -1;                   // rank 0's listening socket, when this node runs rank 0
  std::unique_ptr<StoreServer> store_;  // the attempt's store on it
  Sentinel sentinel_;
};

}  // namespace

int SuperviseWorkers(const LaunchPlan& plan) { return Supervisor(plan).Run(); }

}  // namespace cli
}  // namespace keel
