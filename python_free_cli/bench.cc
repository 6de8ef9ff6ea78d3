// keel bench NAME: times a built-in model's training step; prints one JSON line.
// Timed steps fetch nothing (as a training loop between log lines), so the loop measures compute.
#include <gflags/gflags.h>
#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "executor/executor.h"
#include "fleet/fleet.h"
#include "framework/base/strings.h"
#include "framework/comm/communicator.h"
#include "framework/dsl/program_guard.h"
#include "framework/profiler/profiler.h"
#include "framework/runtime/blas.h"
#include "framework/runtime/cpu_threads.h"
#include "framework/runtime/device.h"
#include "models/model_zoo.h"
#include "python_free_cli/commands.h"
#include "python_free_cli/process_util.h"
#include "python_free_cli/train_flags.h"

DECLARE_int32(batch_size);
DECLARE_double(lr);
DECLARE_uint64(seed);
DECLARE_int32(cpu_math_threads);
DECLARE_string(fp16_allreduce);
DEFINE_int32(bench_steps, 200, "Timed steps for keel bench.");
DEFINE_int32(bench_warmup, 10, "Untimed warm-up steps for keel bench.");
DEFINE_int64(bench_numel, 1680000,
             "keel bench allreduce: values per all-reduce (default: the seed MLP's 1.68 M "
             "gradients; float32, or --fp16_allreduce's type).");

namespace keel {
namespace cli {

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// keel bench allreduce: c_allreduce_sum of --bench_numel values through a program, as training
// runs it: of a buffer coalesce_tensor laid out once (so on a shared-memory ring it lives where the
// peers map it, unless --shm_zero_copy_mb=0); float32, or with --fp16_allreduce=fp16|bf16 that
// 16-bit type (what a 16-bit all-reduce of float32 gradients hands the ring). Rank 0 prints one
// JSON line.
int BenchAllReduce() {
  KEEL_ENFORCE(FLAGS_fp16_allreduce == "off" || FLAGS_fp16_allreduce == "fp16" ||
                   FLAGS_fp16_allreduce == "bf16",
               "--fp16_allreduce must be off, fp16 or bf16, got '", FLAGS_fp16_allreduce, "'");
  const DType dtype = FLAGS_fp16_allreduce == "bf16"   ? DType::kBFloat16
                      : FLAGS_fp16_allreduce == "fp16" ? DType::kFloat16
                                                       : DType::kFloat32;
  fleet::init();
  const int world = fleet::worker_num();
  KEEL_ENFORCE(world > 1, "bench allreduce needs several workers: run it under keel launch");
  Program startup, layout, main;
  AppendOp(startup.global_block(), "c_comm_init", {}, {},
           {{"ring_id", 0}, {"nranks", world}, {"rank", fleet::worker_index()}});
  for (Block* b : {&layout.global_block(), &main.global_block()}) {
    VarDesc* fused = b->Var("fused");
    fused->set_shape({FLAGS_bench_numel});
    fused->set_dtype(dtype);
    fused->set_persistable(true);
  }
  VarDesc* g = layout.global_block().Var("grad");
  g->set_shape({FLAGS_bench_numel});
  g->set_dtype(dtype);
  g->set_persistable(true);
  // Zeros: sums that stay finite whatever the number of steps.
  AppendOp(layout.global_block(), "coalesce_tensor", {{"Input", {"grad"}}},
           {{"Output", {"grad"}}, {"FusedOutput", {"fused"}}},
           {{"numels", std::vector<int64_t>{FLAGS_bench_numel}},
            {"dtype", static_cast<int>(dtype)},
            {"set_constant", true}});
  for (Program* p : {&layout, &main})
    AppendOp(p->global_block(), "c_allreduce_sum", {{"X", {"fused"}}}, {{"Out", {"fused"}}});
  Executor exe(fleet::worker_place());
  exe.Run(startup);
  exe.Run(layout);
  for (int i = 0; i < FLAGS_bench_warmup; ++i) exe.Run(main);
  profiler::StartFromFlags();
  std::vector<double> ms;
  for (int i = 0; i < FLAGS_bench_steps; ++i) {
    auto a = std::chrono::steady_clock::now();
    exe.Run(main);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  FinishProfile();
  fleet::barrier_worker();
  if (fleet::worker_index() != 0) return 0;
  double med = Median(ms), bytes = static_cast<double>(SizeOf(dtype)) * FLAGS_bench_numel;
  std::printf(
      "{\"system\": \"keel\", \"bench\": \"allreduce\", \"world\": %d, \"dtype\": \"%s\", "
      "\"bytes\": %.0f, \"allreduce_ms\": %.3f, \"busbw_GBps\": %.3f, \"zero_copy\": %s}\n",
      world, DTypeName(dtype), bytes, med, 2.0 * (world - 1) / world * bytes / (med / 1e3) / 1e9,
      RingRegistry::Get().At(0, "bench").zero_copy_collectives() > 0 ? "true" : "false");
  return 0;
}

// The calling core's FMA limit in GFLOP/s: independent chains of fused multiply-adds of the
// widest vectors this build targets (best of 5 runs of ~20 ms), what no GEMM can exceed.
double CoreFmaPeakGflops() {
#if defined(__AVX512F__)
  using V = __m512;
  constexpr int kLanes = 16;
  auto set = [](float v) { return _mm512_set1_ps(v); };
  auto fma = [](V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); };
  auto first = [](V a) { return _mm512_cvtss_f32(a); };
#elif defined(__AVX2__) && defined(__FMA__)
  using V = __m256;
  constexpr int kLanes = 8;
  auto set = [](float v) { return _mm256_set1_ps(v); };
  auto fma = [](V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); };
  auto first = [](V a) { return _mm256_cvtss_f32(a); };
#else
  return 0;  // no FMA vectors in this build: not measured
#endif
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  constexpr int kChains = 16;  // more than latency x ports on current cores
  constexpr int64_t kIters = 2000000;
  double best = 0;
  for (int run = 0; run < 5; ++run) {
    V acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = set(0.001f * c);
    const V mul = set(0.999999f), add = set(1e-7f);
    auto t = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < kIters; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = fma(acc[c], mul, add);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    float sink = 0;
    for (int c = 0; c < kChains; ++c) sink += first(acc[c]);
    if (sink == 12345.0f) std::printf(" ");  // keeps the chains alive
    best = std::max(best, 2.0 * kLanes * kChains * kIters / sec / 1e9);
  }
  return best;
#endif
}

// keel bench gemm: blas::Gemm (the mul/matmul kernels' GEMM) on the seed MLP's shapes, forward
// and both backward forms; one JSON line per shape with the median GFLOP/s, and the core's FMA
// limit beside it.
int BenchGemm() {
  // Measured again after each shape, the best kept: one measurement can fall on a moment another
  // process has the core (seen under ctest -j2: 61 GFLOP/s against a GEMM's 100).
  double peak = CoreFmaPeakGflops();
  struct Shape {
    const char* what;
    bool ta, tb;
    int64_t M, N, K;
  };
  const Shape shapes[] = {{"fwd X*W", false, false, 128, 1280, 1280},
                          {"dX = dY*W^T", false, true, 128, 1280, 1280},
                          {"dW = X^T*dY", true, false, 1280, 1280, 128}};
  for (const Shape& s : shapes) {
    std::vector<float> a(static_cast<size_t>(s.M * s.K), 0.5f),
        b(static_cast<size_t>(s.K * s.N), 0.25f), c(static_cast<size_t>(s.M * s.N));
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 13) * 0.01f;
    std::vector<double> gflops;
    for (int i = 0; i < FLAGS_bench_warmup + FLAGS_bench_steps; ++i) {
      auto t = std::chrono::steady_clock::now();
      blas::Gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, a.data(), b.data(), 0.0f, c.data());
      double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      if (i >= FLAGS_bench_warmup) gflops.push_back(2.0 * s.M * s.N * s.K / sec / 1e9);
    }
    std::sort(gflops.begin(), gflops.end());
    peak = std::max(peak, CoreFmaPeakGflops());
    std::printf(
        "{\"system\": \"keel\", \"bench\": \"gemm\", \"blas\": \"%s\", \"threads\": %d, "
        "\"shape\": \"%s %lldx%lldx%lld\", \"gflops_median\": %.1f, \"gflops_best\": %.1f, "
        "\"core_fma_peak_gflops\": %.1f}\n",
        blas::Backend(), cpu_threads::Budget(), s.what, static_cast<long long>(s.M),
        static_cast<long long>(s.N), static_cast<long long>(s.K), gflops[gflops.size() / 2],
        gflops.back(), peak);
  }
  return 0;
}

}  // namespace

int Bench(const std::vector<std::string>& args) {
  if (args.size() == 1 && args[0] == "allreduce") return BenchAllReduce();
  if (args.size() == 1 && args[0] == "gemm") return BenchGemm();
  KEEL_ENFORCE(args.size() == 1, "bench takes one model name (",
               StrJoin(models::ModelNames(), ", "), "), got ", args.size(), " arguments");
  KEEL_ENFORCE(FLAGS_bench_steps > 0, "--bench_steps must be positive");
  models::TrainableModel m =
      BuildDistributedModel(args[0], static_cast<float>(FLAGS_lr), FLAGS_seed ? FLAGS_seed : 1);
  // Parameter-server jobs (keel launch --server_num): a server serves until the trainers stop.
  if (fleet::is_server()) return RunParameterServer("");
  const bool ps = fleet::role().is_ps();
  const int world = fleet::worker_num();
  Executor exe(fleet::worker_place(), CliExecutionStrategy());
  exe.Run(*m.startup);
  const TrainingStepFn step = TrainingStep(m);  // a pipeline stage: its micro-batches
  FeedMap feed;
  m.next_batch(FLAGS_batch_size, &feed);  // one batch, reused, as the torch anchor does
  for (int i = 0; i < FLAGS_bench_warmup; ++i) step(exe, feed, {});
  // A CUDA place's run returns once its work is queued: each timed step waits for the device, as
  // the PyTorch anchor synchronises (a no-op on the CPU).
  const Place place = exe.place();
  DeviceSynchronize(place);
  DeviceResetPeakStats(place);
  fleet::barrier_worker();
  profiler::StartFromFlags();
  const int64_t bytes0 = RingRegistry::Get().TotalAllReduceBytes();
  std::vector<double> ms;
  ms.reserve(FLAGS_bench_steps);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < FLAGS_bench_steps; ++i) {
    auto a = std::chrono::steady_clock::now();
    step(exe, feed, {});
    DeviceSynchronize(place);
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The bytes this rank handed to all-reduces per timed step (--fp16_allreduce halves them).
  const double allreduce_bytes =
      static_cast<double>(RingRegistry::Get().TotalAllReduceBytes() - bytes0) / FLAGS_bench_steps;
  FinishProfile();
  fleet::barrier_worker();
  float loss = step(exe, feed, {m.loss})[0].item<float>();
  double median = Median(ms);
  double mean = total * 1e3 / FLAGS_bench_steps;
  // Samples per second of every worker together: of each data-parallel replica (a pipeline's
  // stages and a tensor-parallel group's ranks share one batch). In parameter-server mode the
  // trainers' own rates summed (asynchronous trainers run at their own pace), then the servers
  // are told they stop.
  const int replicas = std::max(1, world / (FLAGS_tp_degree * FLAGS_pp_degree));
  double samples_per_s = replicas * FLAGS_batch_size / (median / 1e3);
  std::string ps_fields;
  if (ps) {
    samples_per_s = fleet::metrics::sum(FLAGS_batch_size / (median / 1e3));
    fleet::stop_worker();
    ps_fields = StrCat(", \"ps_mode\": \"", FLAGS_ps_mode, "\", \"servers\": ", fleet::server_num(),
                       FLAGS_ps_mode == "geo" ? StrCat(", \"geo_k\": ", FLAGS_geo_k) : "");
  }
  if (fleet::worker_index() != 0) return 0;
  // On a GPU: the caching allocator's peak over the timed steps (torch.cuda.max_memory_allocated's
  // counterpart) and whether the steps replayed a CUDA graph.
  const std::string gpu =
      place.is_cuda()
          ? StrCat(", \"place\": \"", place.str(),
                   "\", \"cuda_graph\": ", exe.CudaGraphCaptures(*m.main) > 0 ? "true" : "false",
                   ", \"peak_mem_mb\": ",
                   static_cast<double>(DeviceAllocatorStats(place).peak_in_use_bytes) / (1 << 20))
          : std::string();
  std::printf(
      "{\"system\": \"keel\", \"model\": \"%s\", \"world\": %d, \"threads\": %d, "
      "\"workers\": %d, "
      "\"blas\": \"%s\", \"batch\": %d, \"steps\": %d, \"step_ms\": %.3f, "
      "\"step_ms_mean\": %.3f, \"samples_per_s\": %.1f, \"allreduce_bytes_per_step\": %.0f, "
      "\"loss\": %.5f, \"cpu_sched\": \"%s\", \"cpus\": %d%s%s}\n",
      args[0].c_str(), world, FLAGS_cpu_math_threads, exe.WorkersFor(*m.main), blas::Backend(),
      FLAGS_batch_size, FLAGS_bench_steps, median, mean, samples_per_s, allreduce_bytes, loss,
      // The policy the steps ran under (keel launch --cpu_sched) and the CPUs this rank may run
      // on (its affinity mask: keel launch --cpu_bind=cores narrows it): numbers differ by both.
      sched_getscheduler(0) == SCHED_BATCH ? "batch" : "normal", CpuCount(), ps_fields.c_str(),
      gpu.c_str());
  return 0;
}

}  // namespace cli
}  // namespace keel
