// Runs every collective op on every dtype through real programs, on the ranks `keel launch` gives,
// and checks the results against values computed locally, for a tiny tensor and for one that
// spans several shared-memory chunks with uneven slices. Exit 0 when all match; 1 with the first
// mismatch otherwise. Used by tests/comm/collective_ops_test.cc.
//
// KEEL_TEST_MODE selects a fault instead: "mismatch" (rank 1 broadcasts while the others
// all-reduce), "exit" (rank 1 exits cleanly right after setup), "stall" (rank 1 sleeps 30 s before
// its first collective), "shm_names" (print how many /dev/shm names of this job remain), "p2p"
// (point-to-point transfers, RunP2P), "pieces_nap" (two zero-copy all-reduces while
// KEEL_FAULT_DELAY holds a rank back until another has returned), "late" (rank 1 sleeps 3 s before
// its first collective, which then completes), "killed_mid_send" (rank 0
// broadcasts 256 MiB on a Gloo ring; rank 1 kills itself with SIGKILL once the first bytes
// arrived, the rest unread: rank 0's send is then half written when the connection breaks),
// "killed_mid_p2p" (the same with a point-to-point send of rank 0, which then exits),
// "stale_relay", "early_leaver", "p2p_early_leaver" and "staggered_leavers" (see there).
#include <keel/keel.h>

#include <dirent.h>
#include <gflags/gflags.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "fleet/fleet.h"
#include "framework/comm/communicator.h"

using namespace keel;

namespace {

int g_failures = 0;

void Expect(bool ok, const std::string& what) {
  if (!ok) {
    ++g_failures;
    std::fprintf(stderr, "rank %d: MISMATCH %s\n", fleet::worker_index(), what.c_str());
  }
}

template <typename T>
void RunAll(DType dtype, int ring, int64_t len) {
  const int rank = fleet::worker_index(), n = fleet::worker_num();
  Program main;
  Block& b = main.global_block();
  auto var = [&](const std::string& name, std::vector<int64_t> shape) {
    VarDesc* v = b.Var(name);
    v->set_dtype(dtype);
    v->set_shape(shape);
    return name;
  };
  var("x", {len});
  b.FindVar("x")->set_is_data(true);
  for (std::string op :
       {"c_allreduce_sum", "c_allreduce_max", "c_allreduce_min", "c_allreduce_prod", "c_broadcast"})
    AppendOp(b, op, {{"X", {"x"}}}, {{"Out", {var(op + "_out", {len})}}},
             op == "c_broadcast"
                 ? std::map<std::string, Attribute>{{"ring_id", ring}, {"root", n - 1}}
                 : std::map<std::string, Attribute>{{"ring_id", ring}});
  AppendOp(b, "c_allgather", {{"X", {"x"}}}, {{"Out", {var("gathered", {len * n})}}},
           {{"ring_id", ring}, {"nranks", n}});
  AppendOp(b, "c_reducescatter", {{"X", {"x"}}}, {{"Out", {var("scattered", {len / n})}}},
           {{"ring_id", ring}, {"nranks", n}});
  AppendOp(b, "c_barrier", {}, {}, {{"ring_id", ring}});

  std::vector<T> x(len);
  auto value = [](int r, int64_t i) { return static_cast<T>((r + 1) * ((i % 3) + 1)); };
  for (int64_t i = 0; i < len; ++i) x[i] = value(rank, i);
  Executor exe;
  auto out = exe.Run(main, {{"x", Tensor::FromVector<T>(x, {len})}},
                     {"c_allreduce_sum_out", "c_allreduce_max_out", "c_allreduce_min_out",
                      "c_allreduce_prod_out", "c_broadcast_out", "gathered", "scattered"});
  std::string tag = std::string(DTypeName(dtype)) + " ring " + std::to_string(ring) + " len " +
                    std::to_string(len);
  const T* got[7];
  for (int k = 0; k < 7; ++k) got[k] = out[k].template data<T>();
  // Counts mismatches per check and reports the first index of each (no string work per element).
  auto check = [&](const char* what, int64_t count, auto&& ok) {
    for (int64_t i = 0; i < count; ++i)
      if (!ok(i)) {
        Expect(false, tag + " " + what + "[" + std::to_string(i) + "]");
        return;
      }
  };
  std::vector<T> sum(len), mx(len), mn(len), prod(len);
  for (int64_t i = 0; i < len; ++i) {
    sum[i] = 0, mx[i] = value(0, i), mn[i] = value(0, i), prod[i] = 1;
    for (int r = 0; r < n; ++r) {
      sum[i] += value(r, i);
      mx[i] = std::max(mx[i], value(r, i));
      mn[i] = std::min(mn[i], value(r, i));
      prod[i] *= value(r, i);
    }
  }
  check("allreduce_sum", len, [&](int64_t i) { return got[0][i] == sum[i]; });
  check("allreduce_max", len, [&](int64_t i) { return got[1][i] == mx[i]; });
  check("allreduce_min", len, [&](int64_t i) { return got[2][i] == mn[i]; });
  check("allreduce_prod", len, [&](int64_t i) { return got[3][i] == prod[i]; });
  check("broadcast", len, [&](int64_t i) { return got[4][i] == value(n - 1, i); });
  check("allgather", len * n, [&](int64_t i) { return got[5][i] == value(int(i / len), i % len); });
  check("reducescatter", len / n,
        [&](int64_t i) { return got[6][i] == sum[rank * (len / n) + i]; });
}

// What the transpiler's gradient fusion runs: coalesce_tensor lays g0 and g1 out in one buffer and
// `op` all-reduces it in place. On a shared-memory ring the executor places that buffer where the
// peers map it, and the all-reduce runs without copies. Values that are not integers, so the sum
// matches only when it is taken in rank order, as the ring's copying path does (shm rings).
int g_fused_runs = 0;

template <typename T>
void RunFused(DType dtype, int ring, const std::string& op, int64_t a, int64_t b) {
  // Gloo reduces floats in an order of its own: near, not the same bits.
  const bool exact =
      std::string(RingRegistry::Get().At(ring, "collective_worker").backend()) == "shm";
  const int rank = fleet::worker_index(), n = fleet::worker_num();
  Program main;
  Block& blk = main.global_block();
  for (auto [name, len] : {std::pair<const char*, int64_t>{"g0", a}, {"g1", b}}) {
    VarDesc* v = blk.Var(name);
    v->set_dtype(dtype);
    v->set_shape({len});
    v->set_is_data(true);
  }
  blk.Var("fused")->set_dtype(dtype);
  AppendOp(blk, "coalesce_tensor", {{"Input", {"g0", "g1"}}},
           {{"Output", {"g0", "g1"}}, {"FusedOutput", {"fused"}}},
           {{"numels", std::vector<int64_t>{a, b}},
            {"dtype", static_cast<int>(dtype)},
            {"copy_data", true}});
  AppendOp(blk, op, {{"X", {"fused"}}}, {{"Out", {"fused"}}}, {{"ring_id", ring}});
  auto value = [](int r, int64_t i) {
    if constexpr (std::is_floating_point_v<T>) return static_cast<T>(0.37 / (r + 2 + i % 5));
    return static_cast<T>((r + 1) * ((i % 3) + 1));
  };
  std::vector<T> x(a + b);
  for (int64_t i = 0; i < a + b; ++i) x[i] = value(rank, i);
  std::vector<T> x0(x.begin(), x.begin() + a), x1(x.begin() + a, x.end());
  Executor exe;
  auto out = exe.Run(
      main, {{"g0", Tensor::FromVector<T>(x0, {a})}, {"g1", Tensor::FromVector<T>(x1, {b})}},
      {"g0", "g1"});
  ++g_fused_runs;
  const std::string tag = "fused " + op + " " + DTypeName(dtype) + " ring " + std::to_string(ring) +
                          " len " + std::to_string(a + b);
  for (int64_t i = 0; i < a + b; ++i) {
    T want = value(0, i);
    for (int r = 1; r < n; ++r) {
      const T v = value(r, i);
      want = op == "c_allreduce_sum"   ? static_cast<T>(want + v)
             : op == "c_allreduce_max" ? std::max(want, v)
                                       : static_cast<T>(want * v);
    }
    const T got = i < a ? out[0].template data<T>()[i] : out[1].template data<T>()[i - a];
    const bool ok = exact || !std::is_floating_point_v<T>
                        ? std::memcmp(&got, &want, sizeof(T)) == 0
                        : std::abs(got - want) <= 1e-5 * std::abs(want);
    if (!ok) {
      Expect(false, tag + "[" + std::to_string(i) + "]");
      return;
    }
  }
}

// Point-to-point transfers on ring 0 between ranks 0 and 1 through the ring's Communicator, as
// send_v2 / recv_v2 call them (KEEL_TEST_MODE=p2p). Returns 0 when every check holds.
// 1. Both ranks send 300 transfers (three tags; float32 and int64; empty, scalar, small and 3 MiB
//    tensors) before receiving any, then receive them tag by tag, the last tag first: sends are
//    buffered and a receive takes exactly its (tag, ordinal), whatever the order.
// 2. One 80 MiB transfer each way (over the store's 64 MiB frame: it cannot go that way).
// 3. Rank 0 sends 1,100 transfers while rank 1 receives them only after 0.3 s (more than the
//    1,024 that shared memory lets wait: the sender waits for room instead of failing).
// 4. Ping-pong of 4 MiB, 40 round trips: prints the time per round trip.
// 5. Rank 1 sends once more and returns at once; rank 0 receives it after rank 1 is gone, then
//    waits for a transfer rank 1 never sent and prints the error it gets.
int RunP2P(int rank) {
  Communicator& ring = RingRegistry::Get().At(0, "collective_worker");
  const int peer = 1 - rank;
  auto value = [](int src, int tag, int64_t i, int64_t k) {
    return static_cast<int64_t>(src) * 1000003 + tag * 7919 + i * 31 + k;
  };
  auto make = [&](int src, int tag, int64_t i) {
    const DType dtype = i % 2 ? DType::kInt64 : DType::kFloat32;
    std::vector<int64_t> dims;
    switch (i % 5) {
      case 0:
        dims = {0, 4};
        break;  // empty
      case 1:
        dims = {};
        break;  // scalar
      case 2:
        dims = {3, 1, 7};
        break;
      case 3:
        dims = {17};
        break;
      default:
        dims = {i % 50 == 4 ? int64_t{768} : 2, 1024};
        break;  // 3 MiB of float32 or 6 of int64
    }
    Tensor t(dtype, DDim(dims));
    for (int64_t k = 0; k < t.numel(); ++k) {
      if (dtype == DType::kInt64)
        t.data<int64_t>()[k] = value(src, tag, i, k);
      else
        t.data<float>()[k] = static_cast<float>(value(src, tag, i, k));
    }
    return t;
  };
  auto check = [&](const Tensor& got, int src, int tag, int64_t i, const std::string& what) {
    const Tensor want = make(src, tag, i);
    bool ok = got.dtype() == want.dtype() && got.dims() == want.dims();
    for (int64_t k = 0; ok && k < want.numel(); ++k)
      ok = want.dtype() == DType::kInt64 ? got.data<int64_t>()[k] == want.data<int64_t>()[k]
                                         : got.data<float>()[k] == want.data<float>()[k];
    Expect(ok, what + " transfer " + std::to_string(i) + " tag " + std::to_string(tag));
  };
  constexpr int kMany = 300;
  for (int64_t i = 0; i < kMany; ++i)
    ring.Send(make(rank, static_cast<int>(i % 3), i), peer, i % 3);
  for (int tag = 2; tag >= 0; --tag)
    for (int64_t i = tag; i < kMany; i += 3) {
      Tensor t;
      ring.Recv(&t, peer, tag);
      check(t, peer, tag, i, "buffered");
    }
  {
    Tensor big(DType::kFloat32, DDim({20, 1024, 1024}));
    std::fill(big.data<float>(), big.data<float>() + big.numel(), static_cast<float>(rank + 1));
    ring.Send(big, peer, 7);
    Tensor got;
    ring.Recv(&got, peer, 7);
    Expect(got.numel() == big.numel() && got.data<float>()[0] == peer + 1 &&
               got.data<float>()[got.numel() - 1] == peer + 1,
           "80 MiB transfer");
  }
  constexpr int kPastTheSlots = 1100;
  if (rank == 0) {
    for (int64_t i = 0; i < kPastTheSlots; ++i) ring.Send(make(0, 9, i % 5 == 4 ? 3 : i), 1, 9);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (int64_t i = 0; i < kPastTheSlots; ++i) {
      Tensor t;
      ring.Recv(&t, 0, 9);
      check(t, 0, 9, i % 5 == 4 ? 3 : i, "backpressured");
    }
  }
  {
    Tensor msg(DType::kFloat32, DDim({1024, 1024}));
    std::fill(msg.data<float>(), msg.data<float>() + msg.numel(), 1.0f);
    Tensor got;
    constexpr int kRounds = 40;
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kRounds; ++r) {
      if (rank == 0) {
        ring.Send(msg, 1, 11);
        ring.Recv(&got, 1, 11);
      } else {
        ring.Recv(&got, 0, 11);
        ring.Send(got, 0, 11);
      }
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        kRounds;
    if (rank == 0)
      std::printf("rank 0: %s ring, 4 MiB ping-pong %.0f us per round trip\n", ring.backend(), us);
  }
  if (rank == 1) {
    ring.Send(make(1, 13, 2), 0, 13);
    std::printf("rank 1: p2p sent its last transfer and returns\n");
    return g_failures ? 1 : 0;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Tensor last;
  ring.Recv(&last, 1, 13);
  check(last, 1, 13, 2, "after the sender returned");
  try {
    ring.Recv(&last, 1, 13);
    Expect(false, "a receive from an exited rank returned");
  } catch (const Error& e) {
    std::printf("rank 0: the receive after rank 1 exited failed: %s\n", e.what());
  }
  if (!g_failures) std::printf("rank 0: p2p transfers match\n");
  return g_failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const int n = fleet::worker_num();
    // KEEL_TEST_NO_ZERO_COPY_RANK=k: that rank alone turns zero-copy off, so the ring's ranks
    // disagree and every all-reduce must take the copying path.
    if (const char* off = std::getenv("KEEL_TEST_NO_ZERO_COPY_RANK"))
      if (std::atoi(off) == fleet::worker_index())
        gflags::SetCommandLineOption("shm_zero_copy_mb", "0");
    Program startup;
    for (int ring = 0; ring < 2; ++ring)
      AppendOp(startup.global_block(), "c_comm_init", {}, {},
               {{"ring_id", ring}, {"nranks", n}, {"rank", fleet::worker_index()}});
    Executor exe;
    exe.Run(startup);
    const int rank = fleet::worker_index();
    const char* backend = RingRegistry::Get().At(0, "collective_worker").backend();
    const char* env_mode = std::getenv("KEEL_TEST_MODE");
    const std::string mode = env_mode ? env_mode : "";
    if (mode == "shm_names") {
      // Names the rings of this job created: /dev/shm/keel-<rank 0's pid>-...
      int left = 0;
      if (DIR* d = opendir("/dev/shm")) {
        std::string prefix = "keel-" + std::to_string(getpid()) + "-";
        while (dirent* e = readdir(d))
          left += std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0;
        closedir(d);
      }
      std::printf("rank %d: %s rings, %d shm names left\n", rank, backend, left);
      return 0;
    }
    if (mode == "p2p") return rank < 2 ? RunP2P(rank) : 0;
    if (mode == "pieces_nap") {
      // Zero-copy all-reduces of 4 MB while KEEL_FAULT_DELAY (shm_pieces@1:MS@FILE) holds rank 1
      // back in each after it arrived, until FILE exists. Rank 0 creates it only after its first
      // all-reduce returned, which it can only when it takes rank 1's pieces; and only 2.5 s
      // later, from a thread, while it waits in the second all-reduce for rank 1, still in the
      // first (which the collective watch must not take for a mismatch).
      const char* release = std::getenv("KEEL_TEST_RELEASE_FILE");
      std::thread releaser;
      for (int round = 0; round < 2; ++round) {
        RunFused<float>(DType::kFloat32, 0, "c_allreduce_sum", 3, 1000000);
        std::printf("rank %d: all-reduce %d returned, %s\n", rank, round,
                    g_failures ? "wrong" : "right");
        std::fflush(stdout);
        if (round == 0 && rank == 0 && release != nullptr)
          releaser = std::thread([release] {
            std::this_thread::sleep_for(std::chrono::milliseconds(2500));
            std::fclose(std::fopen(release, "w"));
          });
      }
      if (releaser.joinable()) releaser.join();
      return g_failures ? 1 : 0;
    }
    if (mode == "early_leaver" || mode == "p2p_early_leaver") {
      // 3 ranks; rank 2 leaves as soon as its part is done, cleanly, while rank 0 still waits
      // for rank 1, 2.5 s late: its closed connections must not be taken for failed ones.
      // early_leaver: a broadcast from rank 0 (rank 2's part is to receive it). p2p_early_leaver:
      // rank 2 takes no part; rank 0 sends to rank 1 and exits, which waits for the receive.
      RingRegistry::Get().At(1, "collective_worker").Barrier();  // every ring is set up
      Communicator& ring = RingRegistry::Get().At(0, "collective_worker");
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      Tensor t(DType::kFloat32, {8});
      std::fill(t.data<float>(), t.data<float>() + 8, rank == 0 ? 1.0f : 0.0f);
      if (mode == "early_leaver") {
        ring.Broadcast(&t, 0);
      } else if (rank == 0) {
        ring.Send(t, 1, 5);
      } else if (rank == 1) {
        ring.Recv(&t, 0, 5);
      }
      std::printf("rank %d: done, %g\n", rank, t.data<float>()[0]);
      return 0;
    }
    if (mode == "staggered_leavers") {
      // 4 ranks, a broadcast from rank 2 (Gloo's binomial tree: 2 -> 3, then 2 -> 0 and
      // 3 -> 1), rank 1 2.5 s late: rank 3's send to it waits and is probed. Rank 0 leaves as
      // soon as it has received; rank 2 leaves 0.5 s after its sends, when its connection to rank
      // 0 has closed: its goodbye must still reach rank 3 (rank 0 is the first peer it says
      // goodbye to).
      RingRegistry::Get().At(1, "collective_worker").Barrier();  // every ring is set up
      if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
      Tensor t(DType::kFloat32, {8});
      std::fill(t.data<float>(), t.data<float>() + 8, rank == 2 ? 1.0f : 0.0f);
      RingRegistry::Get().At(0, "collective_worker").Broadcast(&t, 2);
      if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      std::printf("rank %d: done, %g\n", rank, t.data<float>()[0]);
      return 0;
    }
    if (mode == "stale_relay") {
      // 4 ranks, a broadcast from rank 0 (Gloo's binomial tree: 0 -> 1, then 0 -> 2 and
      // 1 -> 3). Rank 2 dies at once; rank 0 comes 5 s late, so rank 1's wait for it is probed
      // (after 1 s) and ended, as its connection to rank 2 failed; rank 3 comes 0.5 s late, so
      // its own wait (for rank 1) is probed only 0.5 s after rank 1's. Rank 1, woken with
      // nothing received, must not pass its stale tensor on to rank 3.
      RingRegistry::Get().At(1, "collective_worker").Barrier();  // every ring is set up
      if (rank == 2) std::raise(SIGKILL);
      if (rank == 0) std::this_thread::sleep_for(std::chrono::seconds(5));
      if (rank == 3) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      Tensor t(DType::kFloat32, {8});
      std::fill(t.data<float>(), t.data<float>() + 8, rank == 0 ? 1.0f : 0.0f);
      RingRegistry::Get().At(0, "collective_worker").Broadcast(&t, 0);
      std::printf("rank %d: the broadcast returned %g\n", rank, t.data<float>()[0]);
      return 0;
    }
    if (mode == "killed_mid_send" || mode == "killed_mid_p2p") {
      constexpr int64_t kFloats = int64_t{64} << 20;
      Tensor t(DType::kFloat32, {kFloats});
      float* p = t.data<float>();
      std::fill(p, p + kFloats, rank == 0 ? 1.0f : 0.0f);
      std::thread killer;
      if (rank == 1)
        killer = std::thread([p] {
          // Gloo receives straight into the tensor, from the front (a receive of a tensor of the
          // same shape reuses its memory).
          while (*static_cast<volatile float*>(p) == 0.0f) {
          }
          std::raise(SIGKILL);
        });
      Communicator& ring = RingRegistry::Get().At(0, "collective_worker");
      if (mode == "killed_mid_send") {
        ring.Broadcast(&t, 0);
        std::printf("rank %d: the broadcast returned\n", rank);
      } else if (rank == 0) {
        // The send is queued; the process then exits, and its exit waits for queued sends.
        ring.Send(t, 1, 7);
        std::printf("rank 0: sent, exiting\n");
      } else {
        ring.Recv(&t, 0, 7);
      }
      std::fflush(stdout);
      if (killer.joinable()) killer.join();
      return 0;
    }
    if (!mode.empty()) {
      if (rank == 1 && mode == "exit") return 0;
      if (rank == 1 && mode == "stall") std::this_thread::sleep_for(std::chrono::seconds(30));
      if (rank == 1 && mode == "late") std::this_thread::sleep_for(std::chrono::seconds(3));
      Program p;
      Block& b = p.global_block();
      VarDesc* x = b.Var("x");
      x->set_shape({8});
      x->set_is_data(true);
      bool odd = rank == 1 && mode == "mismatch";
      AppendOp(b, odd ? "c_broadcast" : "c_allreduce_sum", {{"X", {"x"}}}, {{"Out", {"x"}}},
               {{"ring_id", 0}});
      Tensor t(DType::kFloat32, {8});
      std::fill(t.data<float>(), t.data<float>() + 8, 1.0f);
      exe.Run(p, {{"x", t}});
      std::printf("rank %d: fault mode %s ran to the end\n", rank, mode.c_str());
      return 0;
    }
    // Tiny, and 1.2 MB of float32 per rank: several 1 MiB chunks, slices that do not divide.
    for (int64_t len : {int64_t{6} * n, int64_t{300007} * n}) {
      for (int ring = 0; ring < 2; ++ring) {
        RunAll<float>(DType::kFloat32, ring, len);
        RunAll<double>(DType::kFloat64, ring, len);
        RunAll<int64_t>(DType::kInt64, ring, len);
        RunAll<int32_t>(DType::kInt32, ring, len);
      }
    }
    for (int ring = 0; ring < 2; ++ring)
      for (const char* op : {"c_allreduce_sum", "c_allreduce_max", "c_allreduce_prod"})
        for (int64_t len : {int64_t{7}, int64_t{400009}}) {
          RunFused<float>(DType::kFloat32, ring, op, 3, len);
          RunFused<double>(DType::kFloat64, ring, op, 3, len);
          RunFused<int64_t>(DType::kInt64, ring, op, 3, len);
          RunFused<int32_t>(DType::kInt32, ring, op, 3, len);
        }
    int64_t zero_copy = 0;
    for (int ring = 0; ring < 2; ++ring)
      zero_copy += RingRegistry::Get().At(ring, "collective_worker").zero_copy_collectives();
    std::printf("rank %d: %lld of %d fused all-reduces without copies\n", rank,
                static_cast<long long>(zero_copy), g_fused_runs);
    if (!g_failures) std::printf("rank %d: %s rings\n", rank, backend);
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", fleet::initialized() ? fleet::worker_index() : -1,
                 e.what());
    return 1;
  }
  if (g_failures) return 1;
  std::printf("rank %d: all collectives match\n", fleet::worker_index());
  return 0;
}
