// CUDA graphs (ctest label `gpu`): a captured and replayed step gives the plain step's bits, with
// dropout (the run index comes from device memory), Adam, cuDNN models and one NCCL rank; new feed
// shapes and scope drops capture again; replays call cudaMalloc zero times; programs that cannot
// be captured are refused naming the op or flag. Skips without a CUDA device.
#include <gflags/gflags.h>
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <string>
#include <utility>

#include "executor/executor.h"
#include "executor/executor_io.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "framework/runtime/device.h"
#include "models/model_zoo.h"
#include "tests/util/gpu_test_util.h"
#include "tests/util/op_test_util.h"
#include "tests/util/subprocess.h"

DECLARE_bool(check_nan_inf);
DECLARE_bool(profile_sync_ops);
DECLARE_bool(cudnn_deterministic);

namespace keel::testing {
namespace {

// fc-relu-dropout-fc with Adam: random draws, optimizer state and a lr-free update every step.
struct DropoutMlp {
  Program main, startup;
  Var loss;
  DropoutMlp() {
    main.set_random_seed(7);
    startup.set_random_seed(7);
    ProgramGuard g(main, startup);
    Var x = layers::data("x", {-1, 16});
    Var h = layers::dropout(layers::fc(x, 32, "relu"), 0.25f);
    loss = layers::mean(layers::fc(h, 1));
    optimizer::Adam(0.01f).minimize(loss, &startup);
  }
};

Tensor Batch(int64_t rows, int step) { return R({rows, 16}, -1, 1, 100 + step); }

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.dims() == b.dims() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Runs `rows_per_step.size()` steps of DropoutMlp on GPU 0, with or without graphs; returns the
// losses and the parameters at the end.
struct Trained {
  std::vector<Tensor> losses;
  std::vector<Tensor> params;
  int64_t captures = 0;
};
Trained TrainMlp(bool graph, const std::vector<int64_t>& rows_per_step, int drop_every = 100) {
  DropoutMlp m;
  ExecutionStrategy s;
  s.use_cuda_graph = graph;
  s.num_iteration_per_drop_scope = drop_every;
  Executor exe(CUDAPlace(0), s);
  exe.Run(m.startup);
  Trained t;
  for (size_t i = 0; i < rows_per_step.size(); ++i)
    t.losses.push_back(
        exe.Run(m.main, {{"x", Batch(rows_per_step[i], static_cast<int>(i))}}, {m.loss})[0]);
  for (VarDesc* v : m.main.global_block().AllVars())
    if (v->is_parameter())
      t.params.push_back(exe.scope().FindVar(v->name())->tensor().Clone(CPUPlace()));
  t.captures = exe.CudaGraphCaptures(m.main);
  return t;
}

void ExpectSameRun(const Trained& got, const Trained& want) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_TRUE(SameBits(got.losses[i], want.losses[i]))
        << "step " << i << ": " << got.losses[i].item<float>() << " vs "
        << want.losses[i].item<float>();
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i)
    EXPECT_TRUE(SameBits(got.params[i], want.params[i])) << "parameter " << i;
}

TEST(CudaGraph, ReplayedStepsEqualPlainStepsBitForBit) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> rows(10, 32);
  Trained plain = TrainMlp(false, rows);
  Trained graph = TrainMlp(true, rows);
  EXPECT_EQ(plain.captures, 0);
  EXPECT_EQ(graph.captures, 1);
  ExpectSameRun(graph, plain);
  // Dropout drew a new mask every replay: the losses differ step to step even where the inputs
  // would repeat the same mask.
  EXPECT_FALSE(SameBits(graph.losses[8], graph.losses[9]));
}

TEST(CudaGraph, ANewBatchSizeCapturesAgainAndStillMatches) {
  SKIP_WITHOUT_GPU();
  std::vector<int64_t> rows;
  for (int64_t r : {32, 8, 32})
    for (int i = 0; i < 4; ++i) rows.push_back(r);
  Trained plain = TrainMlp(false, rows);
  Trained graph = TrainMlp(true, rows);
  EXPECT_EQ(graph.captures, 3);
  ExpectSameRun(graph, plain);
}

TEST(CudaGraph, AScopeDropCapturesAgainAndStillMatches) {
  SKIP_WITHOUT_GPU();
  const std::vector<int64_t> rows(12, 16);
  Trained plain = TrainMlp(false, rows, 5);
  Trained graph = TrainMlp(true, rows, 5);
  EXPECT_EQ(graph.captures, 2);  // steps 3 and 8 (after the drop at step 5 and its warm-up)
  ExpectSameRun(graph, plain);
}

// The test program shares the temporaries' names (and so their vars) with the training program;
// evaluating a bigger batch reallocates them under the training graph, which must notice and
// capture again rather than replay into freed memory.
TEST(CudaGraph, AnEvalProgramThatReallocatesSharedVarsMakesTheTrainingGraphCaptureAgain) {
  SKIP_WITHOUT_GPU();
  std::vector<float> losses[2];
  int64_t captures = 0;
  for (int graph = 0; graph < 2; ++graph) {
    DropoutMlp m;
    std::unique_ptr<Program> test = m.main.clone_for_test();
    ExecutionStrategy s;
    s.use_cuda_graph = graph == 1;
    Executor exe(CUDAPlace(0), s);
    exe.Run(m.startup);
    for (int step = 0; step < 12; ++step) {
      losses[graph].push_back(exe.Run(m.main, {{"x", Batch(16, step)}}, {m.loss})[0].item<float>());
      if (step % 4 == 3)
        losses[graph].push_back(
            exe.Run(*test, {{"x", Batch(200, 50 + step)}}, {m.loss})[0].item<float>());
    }
    if (graph) captures = exe.CudaGraphCaptures(m.main);
  }
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_GE(captures, 2) << "the training graph was replayed after the eval moved its buffers";
}

TEST(CudaGraph, BuiltInModelsReplayTheirPlainStepsAndCallCudaMallocZeroTimes) {
  SKIP_WITHOUT_GPU();
  // Bit-equal runs need convolution algorithms without atomics (ResNet's losses of two plain runs
  // otherwise part at step 2).
  gflags::FlagSaver saver;
  FLAGS_cudnn_deterministic = true;
  for (const char* name : {"mlp", "resnet", "transformer"}) {
    SCOPED_TRACE(name);
    std::vector<float> losses[2];
    for (int graph = 0; graph < 2; ++graph) {
      models::ModelConfig cfg;
      cfg.name = name;
      cfg.seed = 3;
      models::TrainableModel m = models::BuildModel(cfg);
      ExecutionStrategy s;
      s.use_cuda_graph = graph == 1;
      Executor exe(CUDAPlace(0), s);
      exe.Run(*m.startup);
      const int64_t batch = std::string(name) == "mlp" ? 64 : 8;
      std::vector<FeedMap> feeds(8);
      for (auto& f : feeds) m.next_batch(batch, &f);
      int64_t mallocs = 0;
      for (int step = 0; step < 8; ++step) {
        if (step == 4) mallocs = DeviceMallocCount();
        losses[graph].push_back(exe.Run(*m.main, feeds[step], {m.loss})[0].item<float>());
      }
      if (graph) {
        EXPECT_EQ(exe.CudaGraphCaptures(*m.main), 1);
        EXPECT_EQ(DeviceMallocCount(), mallocs) << "cudaMalloc while replaying";
      }
    }
    EXPECT_EQ(losses[1], losses[0]);
  }
}

TEST(CudaGraph, OneNcclRankReplaysTheTranspiledProgramExactly) {
  SKIP_WITHOUT_GPU();
  const std::string dir = MakeTempDir();
  auto train = [&](bool graph) {
    const std::string out = dir + (graph ? "/graph" : "/plain");
    const std::string cmd = "FLAGS_selected_gpus=0 FLAGS_gpu_comm_backend=nccl " +
                            BinPath("mlp_dp_worker") +
                            " --steps=12 --rings=2 --fuse --fuse_num=2 "
                            "--opt=adam --out=" +
                            out + (graph ? " --cuda_graph" : "");
    auto r = RunCommand(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    return LoadSafetensors(out + "/" + kPersistablesFile);
  };
  NamedTensors plain = train(false), graph = train(true);
  ASSERT_FALSE(plain.empty());
  ASSERT_EQ(graph.size(), plain.size());
  for (size_t k = 0; k < plain.size(); ++k)
    EXPECT_TRUE(SameBits(graph[k].second, plain[k].second)) << plain[k].first;
  RunCommand("rm -rf " + dir);
}

// sync_batch_norm alone on one GPU (no ring: its kernels run on the compute stream) is captured
// and replayed: ResNet-20's losses with --cuda_graph are those of the plain steps. (Deterministic
// convolution algorithms, as in BuiltInModels...: two plain runs with cuDNN's atomics part at step
// 2, 1.5e-5 apart, on the H200.)
TEST(CudaGraph, SyncBatchNormAloneReplaysItsPlainSteps) {
  SKIP_WITHOUT_GPU();
  auto losses = [](bool graph) {
    const std::string cmd = "FLAGS_selected_gpus=0 FLAGS_cudnn_deterministic=true " +
                            BinPath("keel") +
                            " train --model=resnet --sync_batch_norm --steps=4 --batch_size=8 "
                            "--seed=5 --progress=lines" +
                            (graph ? " --cuda_graph" : "") + " 2>&1";
    auto r = RunCommand(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    std::string lines;
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);)
      if (line.rfind("step ", 0) == 0) lines += line.substr(0, line.find(" samples/s")) + "\n";
    return lines;
  };
  const std::string plain = losses(false);
  EXPECT_NE(plain, "");
  EXPECT_EQ(losses(true), plain);
}

// Two ranks sharing GPU 0 all-reduce through host memory, which a graph cannot capture. (One rank
// alone has no ring: fleet transpiles only for two or more.)
TEST(CudaGraph, HostStagedRingsAreRefusedNamingTheFlag) {
  SKIP_WITHOUT_GPU();
  const std::string dir = MakeTempDir();
  const std::string cmd = BinPath("keel") + " launch --selected_gpus=0,0 --gpu_comm_backend=host" +
                          " --log_dir=" + dir + " " + BinPath("mlp_dp_worker") +
                          " --steps=4 --cuda_graph; echo launch_exit=$?; cat " + dir +
                          "/workerlog.*";
  auto r = RunCommand(cmd);
  EXPECT_EQ(r.output.find("launch_exit=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launch_exit="), std::string::npos) << r.output;
  ExpectContainsAll(r.output, {"use_cuda_graph", "--gpu_comm_backend=nccl"});
  RunCommand("rm -rf " + dir);
}

TEST(CudaGraph, ProgramsThatCannotBeCapturedAreRefusedNamingTheOpOrFlag) {
  SKIP_WITHOUT_GPU();
  ExecutionStrategy s;
  s.use_cuda_graph = true;
  // Flags that wait for or read the device after each op.
  for (auto [flag, name] : {std::pair{&FLAGS_check_nan_inf, "FLAGS_check_nan_inf"},
                            std::pair{&FLAGS_profile_sync_ops, "FLAGS_profile_sync_ops"}}) {
    DropoutMlp m;
    Executor exe(CUDAPlace(0), s);
    exe.Run(m.startup);
    *flag = true;
    const std::string e = ErrorOf([&] { exe.Run(m.main, {{"x", Batch(4, 0)}}); });
    *flag = false;
    ExpectContainsAll(e, {"use_cuda_graph", name});
  }
  {
    // A random fill in the main program would repeat its host draws on every replay.
    Program main, startup;
    {
      ProgramGuard g(main, startup);
      Var x = layers::data("x", {-1, 4});
      Var w = layers::fill_constant({4, 4}, DType::kFloat32, 0.5f);
      layers::mean(layers::matmul(x, w));
    }
    // w is redrawn on the host every step instead of filled.
    Block& b = main.global_block();
    for (size_t i = 0; i < b.num_ops(); ++i) {
      if (b.op(i)->type() != "fill_constant") continue;
      OpDesc* draw = b.InsertOp(i, "uniform_random");
      draw->SetOutput("Out", b.op(i + 1)->Output("Out"));
      draw->SetAttr("shape", std::vector<int64_t>{4, 4});
      draw->SetAttr("min", -1.0f);
      draw->SetAttr("max", 1.0f);
      draw->SetAttr("seed", 0);
      draw->SetAttr("dtype", static_cast<int>(DType::kFloat32));
      break;
    }
    Executor exe(CUDAPlace(0), s);
    exe.Run(startup);
    const Tensor x = R({2, 4});
    exe.Run(main, {{"x", x}});
    exe.Run(main, {{"x", x}});  // warm-up runs are plain
    ExpectContainsAll(ErrorOf([&] {
                        exe.Run(main, {{"x", x}});
                      }),
                      {"use_cuda_graph", "uniform_random draws its random numbers on the host"});
  }
}

}  // namespace
}  // namespace keel::testing
