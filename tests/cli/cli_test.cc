// The `keel` binary end to end: training output, determinism, checkpoints, and bad input giving
// exit code 1 with a message (never a crash).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "executor/executor_io.h"
#include "framework/io/checkpoint.h"
#include "framework/io/safetensors.h"
#include "tests/util/subprocess.h"
#include "tests/util/test_data.h"

namespace keel::testing {
namespace {

std::vector<double> Losses(const std::string& out) {
  std::vector<double> losses;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    int step;
    double loss;
    if (std::sscanf(line.c_str(), "step %d loss %lf", &step, &loss) == 2) losses.push_back(loss);
  }
  return losses;
}

TEST(KeelTrain, SameSeedPrintsIdenticalLosses) {
  std::string cmd = Keel() + " train --model=mlp --steps=20 --seed=7 --fetch_frequency=5";
  auto a = RunCommand(cmd), b = RunCommand(cmd);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto la = Losses(a.output), lb = Losses(b.output);
  ASSERT_EQ(la.size(), 4u) << a.output;
  EXPECT_EQ(la, lb);
  auto c = RunCommand(Keel() + " train --model=mlp --steps=20 --seed=8 --fetch_frequency=5");
  EXPECT_NE(Losses(c.output), la);
}

TEST(KeelTrain, LossFallsFromLn2) {
  auto r = RunCommand(Keel() + " train --model=mlp --steps=150 --seed=1 --fetch_frequency=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = Losses(r.output);
  ASSERT_EQ(l.size(), 15u);
  EXPECT_NEAR(l.front(), std::log(2.0), 0.05) << r.output;
  EXPECT_LT(l.back(), l.front() - 0.1) << r.output;
}

// The checkpoint holds the trained parameters, and a resumed run starts from them: loading and
// saving again gives the same tensors bit for bit, and the resumed first loss (on the same first
// batch) is the trained model's, not the fresh one's.
TEST(KeelTrain, SavesACheckpointThatInspectReadsAndTrainResumesFrom) {
  std::string dir = MakeTempDir();
  const std::string base = Keel() + " train --seed=2 --mlp_hidden=64 --fetch_frequency=1";
  auto r = RunCommand(base + " --steps=5 --save_dir=" + dir + "/ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto i = RunCommand(Keel() + " inspect " + dir + "/ckpt");
  ASSERT_EQ(i.exit_code, 0) << i.output;
  EXPECT_NE(i.output.find("fc_1.w_0 : float32[64, 64]"), std::string::npos) << i.output;
  EXPECT_NE(i.output.find("learning_rate_0 : float32[1]"), std::string::npos) << i.output;

  auto again =
      RunCommand(base + " --steps=0 --load_dir=" + dir + "/ckpt --save_dir=" + dir + "/again");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("resumed from"), std::string::npos);
  NamedTensors saved = LoadSafetensors(dir + "/ckpt/" + kPersistablesFile);
  NamedTensors reloaded = LoadSafetensors(dir + "/again/" + kPersistablesFile);
  ASSERT_EQ(saved.size(), reloaded.size());
  for (size_t k = 0; k < saved.size(); ++k) {
    EXPECT_EQ(saved[k].first, reloaded[k].first);
    ASSERT_EQ(saved[k].second.dims(), reloaded[k].second.dims());
    EXPECT_EQ(std::memcmp(saved[k].second.raw_data(), reloaded[k].second.raw_data(),
                          saved[k].second.numel() * SizeOf(saved[k].second.dtype())),
              0)
        << saved[k].first;
  }

  auto fresh = Losses(RunCommand(base + " --steps=1").output);
  // The checkpoint holds step 5: --steps counts the whole run, so one more step is --steps=6.
  auto resumed = Losses(RunCommand(base + " --steps=6 --load_dir=" + dir + "/ckpt").output);
  auto trained = Losses(r.output);
  ASSERT_EQ(fresh.size(), 1u);
  ASSERT_EQ(resumed.size(), 1u);
  ASSERT_EQ(trained.size(), 5u);
  EXPECT_NE(resumed[0], fresh[0]);
  EXPECT_LT(resumed[0], trained[0]) << "the resumed model has trained 5 steps";
  RunCommand("rm -rf " + dir);
}

// Item by item, settings `keel train` would have ignored are refused, naming them.
TEST(KeelTrain, SettingsThatWouldBeIgnoredAreRefused) {
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {"--model=mlp --data=mnist:/tmp", "model mlp trains on synthetic data and takes no dataset"},
      {"--model=transformer --data=x", "model transformer trains on synthetic data"},
      {"--local_sgd_warmup_steps=3", "--local_sgd_warmup_steps applies only to LocalSGD"},
      {"--local_sgd_steps=2 --fuse_all_reduce_ops",
       "--fuse_all_reduce_ops does not combine with --local_sgd_steps"},
      {"--model=resnet --mlp_hidden=8", "--mlp_hidden=8 is the width of the mlp model"},
      {"--sync_nccl_allreduce=false",
       "DistributedStrategy.sync_nccl_allreduce=false is not implemented in keel"},
      {"--fuse_all_reduce_ops=false --fuse_parameter_memory_size=16",
       "are given but DistributedStrategy.fuse_all_reduce_ops=false"},
      {"--fuse_parameter_groups_size=50", "FLAGS_fuse_parameter_groups_size=50 has no effect"},
      {"--local_sgd_steps=2 --fuse_parameter_memory_size=16",
       "LocalSGD all-reduces parameters, not gradients"},
      {"--bench_steps=3", "--bench_steps is not a flag of keel train"},
      {"--nproc_per_node=2",
       "--nproc_per_node is not a flag of keel train (it would be ignored; "
       "it is a flag of keel launch)"},
  };
  for (const Case& c : cases) {
    auto r = RunCommand(Keel() + " train --steps=1 --batch_size=4 " + c.flags);
    EXPECT_EQ(r.exit_code, 1) << c.flags << "\n" << r.output;
    EXPECT_FALSE(r.signaled);
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.flags << "\n" << r.output;
  }
  // --steps beside --epochs, on a model whose epoch is its dataset.
  if (HaveMnist()) {
    auto r = RunCommand(Keel() + " train --model=lenet --data=mnist:" + MnistDir() +
                        " --epochs=1 --steps=5");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--steps=5 with --epochs=1: model lenet has a finite training set"),
              std::string::npos)
        << r.output;
  }
  // Multi-worker settings on one worker are said to do nothing.
  auto one = RunCommand(Keel() + " train --steps=1 --mlp_hidden=8 --nccl_comm_num=2");
  EXPECT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("--nccl_comm_num: multi-worker settings, with no effect on a single "
                            "worker"),
            std::string::npos)
      << one.output;
}

// --selected_gpus as a flag picks the worker's GPU (it used to be read from the environment
// only): the role says gpus=0, and training then runs there or, with no GPU, says so.
TEST(KeelTrain, SelectedGpusFlagPicksTheWorkersGpu) {
  auto r = RunCommand("env -u FLAGS_selected_gpus " + Keel() +
                      " train --steps=1 --mlp_hidden=8 --batch_size=4 --selected_gpus=0");
  EXPECT_NE(r.output.find("gpus=0"), std::string::npos) << r.output;
  if (r.exit_code != 0) {
    EXPECT_NE(r.output.find("CUDA"), std::string::npos) << r.output;
  }
}

TEST(KeelInspect, PrintsTheInferenceProgramAsTextAndDot) {
  std::string dir = MakeTempDir();
  auto r = RunCommand(Keel() + " train --steps=1 --seed=2 --save_inference_dir=" + dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto text = RunCommand(Keel() + " inspect " + dir + "/__model__");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("softmax(X: "), std::string::npos) << text.output;
  EXPECT_EQ(text.output.find("sgd("), std::string::npos) << text.output;
  EXPECT_EQ(text.output.find("_grad("), std::string::npos) << text.output;
  auto dot = RunCommand(Keel() + " inspect --dot " + dir + "/__model__");
  ASSERT_EQ(dot.exit_code, 0) << dot.output;
  EXPECT_EQ(dot.output.rfind("digraph program {", 0), 0u) << dot.output;
  auto both = RunCommand(Keel() + " inspect " + dir);
  EXPECT_NE(both.output.find("fc_0.w_0 : float32[32, 1280]"), std::string::npos) << both.output;
  // --dot on the directory: the digraph alone (its last line closes it), no tensor table after.
  auto dir_dot = RunCommand(Keel() + " inspect --dot " + dir + " 2>/dev/null");
  ASSERT_EQ(dir_dot.exit_code, 0) << dir_dot.output;
  EXPECT_EQ(dir_dot.output.rfind("digraph program {", 0), 0u) << dir_dot.output;
  EXPECT_EQ(dir_dot.output.substr(dir_dot.output.size() - 2), "}\n") << dir_dot.output;
  EXPECT_EQ(dir_dot.output.find("tensors"), std::string::npos) << dir_dot.output;
  auto tensors_dot = RunCommand(Keel() + " inspect --dot " + dir + "/params.safetensors");
  EXPECT_NE(tensors_dot.exit_code, 0);
  EXPECT_NE(tensors_dot.output.find("--dot draws a program"), std::string::npos)
      << tensors_dot.output;
  RunCommand("rm -rf " + dir);
}

// NaN or infinity as a time interval made the straggler monitor spin (or never report): refused.
TEST(KeelErrors, ANonFiniteStragglerIntervalIsRefused) {
  for (const char* bad : {"nan", "inf", "-1"}) {
    SCOPED_TRACE(bad);
    auto r = RunCommand(
        Keel() + " train --steps=2 --fetch_frequency=1 --straggler_report_interval_s=" + bad);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--straggler_report_interval_s must be a finite number"),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("step 0"), std::string::npos) << r.output;
  }
}

// An unwritable --profile path is refused at start, not after the last step.
TEST(KeelErrors, AnUnwritableProfilePathIsRefusedBeforeTraining) {
  std::string dir = MakeTempDir();
  for (const std::string& bad : {dir + "/missing/trace.json", dir}) {
    SCOPED_TRACE(bad);
    auto r = RunCommand(Keel() + " train --steps=3 --fetch_frequency=1 --profile=" + bad);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("--profile=" + bad), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("step 0"), std::string::npos) << r.output;
  }
  RunCommand("rm -rf " + dir);
}

TEST(KeelErrors, TruncatedCheckpointIsExitOneNamingTheFile) {
  std::string dir = MakeTempDir();
  ASSERT_EQ(RunCommand(Keel() + " train --steps=1 --seed=2 --save_dir=" + dir).exit_code, 0);
  std::string f = dir + "/persistables.safetensors";
  ASSERT_EQ(RunCommand("truncate -s 5000 " + f).exit_code, 0);
  for (const std::string& cmd :
       {Keel() + " inspect " + f, Keel() + " train --steps=1 --load_dir=" + dir}) {
    auto r = RunCommand(cmd);
    EXPECT_EQ(r.exit_code, 1) << cmd << "\n" << r.output;
    EXPECT_FALSE(r.signaled);
    EXPECT_NE(r.output.find(f), std::string::npos) << r.output;
  }
  RunCommand("rm -rf " + dir);
}

TEST(KeelErrors, BadFlagsAndEnvAreExitOneWithAMessage) {
  struct Case {
    std::string cmd, expect;
  } cases[] = {
      {Keel() + " train --batch_size=0", "--batch_size"},
      {Keel() + " train --model=nope", "known: mlp"},
      {"FLAGS_steps=abc " + Keel() + " train", "FLAGS_steps"},
      {Keel() + " inspect /nonexistent/file", "/nonexistent/file"},
      {Keel() + " bench nope", "nope"},
      // No GPU selected: a CUDA graph has nothing to capture, which the first step says.
      {Keel() + " train --steps=1 --cuda_graph",
       "use_cuda_graph (keel train --cuda_graph) needs "
       "a CUDA place; this executor runs on CPUPlace"},
  };
  for (auto& c : cases) {
    auto r = RunCommand(c.cmd);
    EXPECT_EQ(r.exit_code, 1) << c.cmd << "\n" << r.output;
    EXPECT_FALSE(r.signaled) << c.cmd;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.cmd << "\n" << r.output;
  }
}

TEST(KeelFlags, EnvironmentSetsFlagsAndUnknownNamesOnlyWarn) {
  auto r = RunCommand("FLAGS_steps=3 FLAGS_not_a_keel_flag=1 " + Keel() + " train --seed=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Losses(r.output).size(), 3u) << r.output;
  EXPECT_NE(r.output.find("FLAGS_not_a_keel_flag"), std::string::npos) << r.output;
  // The command line wins over the environment.
  r = RunCommand("FLAGS_steps=3 " + Keel() + " train --seed=1 --steps=2");
  EXPECT_EQ(Losses(r.output).size(), 2u) << r.output;
}

// Every flag the keel binary defines is listed here with what pins it: a flag read by one command
// is refused by the others (it would be ignored there), and a new flag fails this walk until it
// is given a row.
TEST(KeelFlags, EveryFlagIsReadOrRefused) {
  // flag -> the test that shows its effect (or, for refusals, the check below).
  const std::map<std::string, std::string> rows = {
      {"comm_timeout_s", "FleetFaults.StrategyCommTimeoutBoundsEveryCollective"},
      {"collective_check_s", "CollectiveMismatch.*"},
      {"fuse_parameter_groups_size", "GradAllReducePass.PaddleFusionFlagsGroupAsPaddleDoes"},
      {"fuse_parameter_memory_size", "GradAllReducePass.PaddleFusionFlagsGroupAsPaddleDoes"},
      {"sync_nccl_allreduce", "KeelTrain.SettingsThatWouldBeIgnoredAreRefused (false: refused)"},
      {"log_sample_ids", "KeelTrainUnderLaunch.LenetRanksTakeDisjointShardsOfOneShuffle"},
      {"selected_gpus", "KeelTrain.SelectedGpusFlagPicksTheWorkersGpu, KeelLaunch.GpuMode..."},
      {"cpu_comm_backend", "DataParallel.NRanksOnBOverNRowsMatchOneRankOnB"},
      {"shm_zero_copy_mb", "DataParallel.FusedGradientsAllReduceWithoutCopiesToTheSameBits"},
      {"cpu_math_threads", "KeelLaunch.FlagsBeforeTheCommandReachTheWorkers"},
      {"profile", "ProfilerCli.*, UserProgram.ProfileFlagWritesATraceAtExit"},
      {"conv_onednn", "Conv2DOp.OneDnnPrimitivesAgreeWithOwnKernelsAndIgnoreTheThreadCount"},
      {"bench_numel", "KeelBench.AllReduceTimesAFloat32OrA16BitBuffer"},
      {"bench_steps", "KeelBench.PrintsOneJsonLine"},
      {"bench_warmup", "KeelBench.PrintsOneJsonLine"},
      {"dot", "KeelInspect.PrintsTheInferenceProgramAsTextAndDot"},
      {"cluster_node_ips", "KeelLaunch.MultiNodeRanksAndEndpoints"},
      {"grace_period_s", "KeelLaunch.WorkersIgnoringSigtermAreKilledAfterTheGracePeriod"},
      {"cpu_sched", "KeelLaunch.CpuSchedPutsTheWorkersUnderSchedBatch"},
      {"cpu_bind", "KeelLaunch.CpuBindGivesEachWorkerItsOwnCpus"},
      {"master_addr", "KeelLaunch.MultiNodeByMasterAddressWithoutClusterIps"},
      {"master_port", "KeelLaunch.MultiNodeByMasterAddressWithoutClusterIps"},
      {"nnodes", "KeelLaunch.MultiNodeRanksAndEndpoints"},
      {"node_ip", "KeelLaunch.MultiNodeRanksAndEndpoints"},
      {"node_rank", "KeelLaunch.MultiNodeRanksAndEndpoints"},
      {"nproc_per_node", "KeelLaunch.EveryWorkerSeesItsRankInBothConventions"},
      {"started_port", "KeelLaunch.MultiNodeRanksAndEndpoints"},
      {"batch_size", "KeelErrors.BadFlagsAndEnvAreExitOneWithAMessage"},
      {"data", "Lenet.ReachesNinetySevenPercentOnRealMnistWithinTheTimeLimit"},
      {"epochs", "Lenet.ReachesNinetySevenPercentOnRealMnistWithinTheTimeLimit"},
      {"fetch_frequency", "KeelTrain.SameSeedPrintsIdenticalLosses"},
      {"fuse_all_reduce_ops", "FleetTraining.KeelTrainStrategyFlagsReachTheStrategy"},
      {"hierarchical_allreduce_inter_nranks",
       "FleetTraining.KeelTrainStrategyFlagsReachTheStrategy"},
      {"load_dir", "KeelTrain.SavesACheckpointThatInspectReadsAndTrainResumesFrom"},
      {"local_sgd_steps", "FleetTraining.KeelTrainStrategyFlagsReachTheStrategy"},
      {"amp", "KeelTrainAmp.Bf16AndFp16TrainTheMlpAndReachTheStrategy"},
      {"tp_degree", "InspectStrategy.TensorParallelGolden, KeelTrain.TensorParallelFlags"},
      {"pp_degree", "InspectStrategy.PipelineGolden, KeelTrain.PipelineFlags"},
      {"micro_batches", "InspectStrategy.PipelineGolden, KeelTrain.PipelineFlags"},
      {"pp_schedule", "KeelTrain.PipelineFlags"},
      {"dropout", "KeelTrain.TransformerSizeFlagsReachTheModel"},
      {"data_format", "Resnet20.ChannelsLastTrainsLikeNchw"},
      {"vocab", "KeelTrain.TransformerSizeFlagsReachTheModel"},
      {"ctr_table",
       "ParameterServerCli.CtrWithADistributedTableTrains, ParameterServerCli.RefusalsNameTheFlag"},
      {"seq_len", "KeelTrain.TransformerSizeFlagsReachTheModel"},
      {"d_model", "KeelTrain.TransformerSizeFlagsReachTheModel"},
      {"heads", "KeelTrain.TransformerSizeFlagsReachTheModel"},
      {"d_ff", "KeelTrain.TransformerSizeFlagsReachTheModel"},
      {"layers", "KeelTrain.TransformerSizeFlagsReachTheModel"},
      {"amp_level",
       "KeelTrainAmp.BadValuesAreRefusedNamingTheFlag, "
       "AmpConvergence.Bf16O1AndO2TrainLenetOnMnistToNinetySevenPercentLikeFloat32"},
      {"fp16_allreduce", "InspectStrategy.AmpO2AndFp16AllReduceGoldens"},
      {"recompute", "KeelTrainAmp.RecomputeRunsResnetAndNeedsMarkedCheckpoints"},
      {"sync_batch_norm", "SyncBatchNormDataParallel.KeelTrainFlagRewritesResnetsBatchNorms"},
      {"gradient_merge_k",
       "InspectStrategy.GradientMergeGolden, "
       "GradientMergeDataParallel.KeelTrainResumesOnMergeStepsAndRefusesBetweenThem"},
      {"local_sgd_warmup_steps", "FleetTraining.KeelTrainStrategyFlagsReachTheStrategy"},
      {"sharding_stage",
       "InspectStrategy.ShardingGolden, Sharding.KeelTrainSavesACompleteCheckpoint"},
      {"log_all_ranks", "FleetTraining.KeelTrainStrategyFlagsReachTheStrategy"},
      {"ring_model_cache", "RingModel.TwoWorkersMeasureOnceThenReadTheCache"},
      {"lr", "models and optimizer tests"},
      {"mlp_hidden", "FleetTraining.KeelTrainUnderLaunchMatchesItsCheckpointFormat"},
      {"model", "KeelErrors.BadFlagsAndEnvAreExitOneWithAMessage"},
      {"nccl_comm_num", "FleetTraining.KeelTrainStrategyFlagsReachTheStrategy"},
      {"num_iteration_per_drop_scope", "Executor (drop scope) tests; keel train passes it on"},
      {"optimizer", "models tests"},
      {"save_dir", "KeelTrain.SavesACheckpointThatInspectReadsAndTrainResumesFrom"},
      {"save_inference_dir", "KeelInspect.PrintsTheInferenceProgramAsTextAndDot"},
      {"seed", "KeelTrain.SameSeedPrintsIdenticalLosses"},
      {"steps", "KeelFlags.EnvironmentSetsFlagsAndUnknownNamesOnlyWarn"},
      {"check_nan_inf", "CheckNanInf.StopsAtTheFirstOpProducingInfAndNamesIt"},
      {"profile_sync_ops",
       "CudaGraph.ProgramsThatCannotBeCapturedAreRefusedNamingTheOpOrFlag; device-time profiles "
       "of tools/gpu_check.sh (GPU)"},
      {"comm_overlap",
       "ProfilerCli.TwoWorkerTraceShowsAllReduceOverlappingBackwardOnAlignedClocks"},
      {"straggler_factor", "FaultTest.AStragglerIsLoggedByRankWithHowFarBehind"},
      {"straggler_report_interval_s", "FaultTest.AStragglerIsLoggedByRankWithHowFarBehind"},
      {"cuda_host_fallback", "HostFallback.* (CUDA places)"},
      {"gpu_comm_backend", "GpuCommBackend.*, KeelLaunch.GpuModeGivesEachWorkerOneGpu"},
      {"allow_tf32", "GPU tests (cuBLAS/cuDNN math mode; run by tools/gpu_check.sh)"},
      {"cudnn_deterministic",
       "CudnnModels.DeterministicConvRepeatsBitForBitAndSearchesOncePerShape"},
      {"cudnn_exhaustive_search",
       "CudnnModels.DeterministicConvRepeatsBitForBitAndSearchesOncePerShape"},
      {"conv_workspace_size_limit", "PickConvAlgo.NoUsableAlgorithmNamesTheOpShapesAndFlags"},
      {"fraction_of_gpu_memory_to_use", "CachingAllocator.* (reserve)"},
      {"cpu_allocator", "CpuAllocator.SteadyStepsTakeNoMemoryFromTheSystemAndADropGivesItBack"},
      {"eager_delete_tensor_gb",
       "EagerDeletion.ChangesNoBitOnAnyThreadCountAndLowersTheStepsPeakMemory"},
      {"init_allocated_mem", "InitAllocatedMem.*, CudaKernels2.* (poisoned outputs)"},
      {"diff", "InspectStrategy.DiffShowsOnlyWhatTheTranspilerAdded"},
      {"nranks", "InspectStrategy.* goldens"},
      {"program", "InspectStrategy.* goldens"},
      {"rank", "InspectStrategy.* goldens"},
      {"startup", "InspectStrategy (saved __model__)"},
      {"strategy", "InspectStrategy.* goldens"},
      {"summary", "InspectSummary.ParameterCountEqualsTheSavedCheckpoint"},
      {"max_restarts", "FaultTest.RestartedJobEndsWithTheUninterruptedRunsParameters"},
      {"stopped_timeout_s", "FaultTest.ANodeWhoseOnlyWorkerIsStoppedEnds"},
      {"num_threads",
       "Executor.ExecStrategyOfTheDistributedStrategyReachesTheExecutorOfMainProgram"},
      {"cuda_graph",
       "KeelErrors.BadFlagsAndEnvAreExitOneWithAMessage (CPU: refused), "
       "CudaGraph.* (GPU)"},
      {"auto_resume", "docs/fault-tolerance.md (Kubernetes/Slurm restarts)"},
      {"save_every", "FaultTest.RestartedJobEndsWithTheUninterruptedRunsParameters"},
      {"beta1", "TrainOptimizerFlags.*, TrainScheduleFlags.*"},
      {"beta2", "TrainOptimizerFlags.*, TrainScheduleFlags.*"},
      {"clip_global_norm", "TrainOptimizerFlags.*, TrainScheduleFlags.*"},
      {"epsilon", "TrainOptimizerFlags.*, TrainScheduleFlags.*"},
      {"lr_boundaries", "TrainOptimizerFlags.*, TrainScheduleFlags.* (piecewise)"},
      {"lr_decay_steps", "TrainOptimizerFlags.*, TrainScheduleFlags.* (cosine)"},
      {"lr_schedule", "TrainOptimizerFlags.*, TrainScheduleFlags.*"},
      {"lr_values", "TrainOptimizerFlags.*, TrainScheduleFlags.* (piecewise)"},
      {"min_lr", "TrainOptimizerFlags.*, TrainScheduleFlags.* (cosine)"},
      {"momentum", "TrainOptimizerFlags.*, TrainScheduleFlags.*"},
      {"nesterov", "TrainOptimizerFlags.*, TrainScheduleFlags.*"},
      {"warmup_start_lr", "TrainOptimizerFlags.*, TrainScheduleFlags.* (warm-up)"},
      {"warmup_steps", "TrainOptimizerFlags.*, TrainScheduleFlags.* (warm-up)"},
      {"weight_decay", "TrainOptimizerFlags.*, TrainScheduleFlags.*, WeightDecay.*"},
      {"eval_every", "TrainTensorboard.LossRateAndAccuracyReadBackWithTensorboard"},
      {"logdir", "TrainTensorboard.LossRateAndAccuracyReadBackWithTensorboard"},
      {"logdir_all_ranks", "TrainTensorboard.EveryRankWritesItsOwnFolderWhenAsked"},
      {"progress", "TrainOptimizerFlags.*, TrainScheduleFlags.* (bar vs lines)"},
      {"server_num", "ParameterServer.*, LaunchPlan.ParameterServerModeGivesServersAndTrainers..."},
      {"worker_num", "ParameterServer.*, LaunchPlan.ParameterServerModeGivesServersAndTrainers..."},
      {"servers",
       "LaunchPlan.ServersAndWorkersListsPlace..., ParameterServerSparse.TwoNodeLaunch..."},
      {"workers",
       "LaunchPlan.ServersAndWorkersListsPlace..., ParameterServerSparse.TwoNodeLaunch..."},
      {"ps", "InspectStrategy.ParameterServerGoldens"},
      {"nservers", "InspectStrategy.ParameterServerGoldens"},
      {"nworkers", "InspectStrategy.ParameterServerGoldens"},
      {"ps_mode", "InspectStrategy.ParameterServerGoldens (async, geo: refused)"},
      {"geo_k", "InspectStrategy.ParameterServerGoldens (refused)"},
      {"ps_max_staleness",
       "ParameterServerCli.RefusalsNameTheFlag, "
       "ParameterServerAsync.OneTrainerWithTheCommunicator..."},
      {"fuse_gemm_epilogue", "InspectStrategy.FuseGemmEpilogueIsOnByDefaultAndTurnsOff"},
      {"safetensors_allow_unverified", "IoTest.AnEditedHeaderOrADeletedChecksumIsCaught"},
  };
  auto list = RunCommand(Keel() + " flags");
  ASSERT_EQ(list.exit_code, 0) << list.output;
  std::map<std::string, std::string> owners;  // flag -> the commands that read it
  std::istringstream in(list.output);
  std::string name, owner;
  while (in >> name >> owner) owners[name] = owner;
  std::set<std::string> listed, pinned;
  for (const auto& kv : owners) listed.insert(kv.first);
  for (const auto& kv : rows) pinned.insert(kv.first);
  EXPECT_EQ(listed, pinned) << "a keel flag without a row here (or a row for a flag that is gone)";
  // A flag of one command, given to another, is refused there.
  const std::map<std::string, std::string> try_in = {{"train", " train --steps=1 --mlp_hidden=8"},
                                                     {"bench", " bench mlp --bench_steps=1"},
                                                     {"inspect", " inspect /nonexistent"}};
  for (const auto& [flag, who] : owners) {
    if (who == "library" || who == "none") {
      EXPECT_NE(who, "none") << "--" << flag << " is read by no command";
      continue;
    }
    for (const auto& [cmd, line] : try_in) {
      if (("," + who + ",").find("," + cmd + ",") != std::string::npos) continue;
      auto r = RunCommand(Keel() + line + " --" + flag + "=1");
      EXPECT_EQ(r.exit_code, 1) << cmd << " --" << flag << "\n" << r.output;
      EXPECT_NE(r.output.find("--" + flag + " is not a flag of keel " + cmd), std::string::npos)
          << r.output;
    }
  }
}

// With the scheduling policy and the CPUs it may run on (`taskset -c 0` narrows them to one).
TEST(KeelBench, PrintsOneJsonLine) {
  auto r = RunCommand(Keel() + " bench mlp --bench_steps=3 --bench_warmup=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"system\": \"keel\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"step_ms\": "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"cpu_sched\": \""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"cpus\": "), std::string::npos) << r.output;
  if (RunCommand("taskset -c 0 true").exit_code != 0) GTEST_SKIP() << "no taskset here";
  r = RunCommand("taskset -c 0 " + Keel() + " bench mlp --bench_steps=1 --bench_warmup=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"cpus\": 1}"), std::string::npos) << r.output;
}

// keel bench allreduce on 2 workers: a float32 buffer of --bench_numel values, or with
// --fp16_allreduce one of that 16-bit type, half the bytes; rank 0 prints the line. A bad type is
// refused naming the flag.
TEST(KeelBench, AllReduceTimesAFloat32OrA16BitBuffer) {
  const std::string dir = MakeTempDir();
  for (const auto& [flag, dtype, bytes] :
       {std::tuple<std::string, std::string, std::string>{"", "float32", "4000"},
        {" --fp16_allreduce=bf16", "bfloat16", "2000"},
        {" --fp16_allreduce=fp16", "float16", "2000"}}) {
    auto r =
        RunCommand(Keel() + " launch --nproc_per_node=2 --log_dir=" + dir + "/log " + Keel() +
                   " bench allreduce --bench_steps=3 --bench_warmup=1 --bench_numel=1000" + flag);
    ASSERT_EQ(r.exit_code, 0) << flag << "\n" << r.output;
    EXPECT_NE(r.output.find("\"dtype\": \"" + dtype + "\", \"bytes\": " + bytes + ","),
              std::string::npos)
        << flag << "\n"
        << r.output;
    EXPECT_NE(r.output.find("\"allreduce_ms\": "), std::string::npos) << r.output;
  }
  auto bad = RunCommand(Keel() + " bench allreduce --fp16_allreduce=int8");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("--fp16_allreduce must be off, fp16 or bf16, got 'int8'"),
            std::string::npos)
      << bad.output;
  RunCommand("rm -rf " + dir);
}

// keel bench gemm: one line per MLP shape, its GFLOP/s below the core's measured FMA limit (a
// GEMM above it would mean the timing or the FLOP count is wrong).
// The format only: how fast is the benchmarks' business (a timed assertion fails under load).
TEST(KeelBench, GemmPrintsGflopsAndTheCoresFmaLimit) {
  auto r = RunCommand(Keel() + " bench gemm --bench_steps=5 --bench_warmup=1 --cpu_math_threads=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string best_key = "\"gflops_best\": ", peak_key = "\"core_fma_peak_gflops\": ";
  int lines = 0;
  for (size_t at = r.output.find(best_key); at != std::string::npos;
       at = r.output.find(best_key, at + 1)) {
    const double best = std::stod(r.output.substr(at + best_key.size()));
    const size_t p = r.output.find(peak_key, at);
    ASSERT_NE(p, std::string::npos) << r.output;
    const double peak = std::stod(r.output.substr(p + peak_key.size()));
    EXPECT_GT(best, 0) << r.output;
    EXPECT_GE(peak, 0) << r.output;  // 0: a portable build has no vector path to measure
    ++lines;
  }
  EXPECT_EQ(lines, 3) << r.output;
}

// --profile works in a program built on the library (it used to be read by keel train and bench
// only): keel::Init starts the profiler and the trace is written when the program exits.
TEST(UserProgram, ProfileFlagWritesATraceAtExit) {
  std::string dir = MakeTempDir();
  auto r =
      RunCommand("cd " + dir + " && " + BinPath("train_mlp") + " --profile=" + dir + "/trace.json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream f(dir + "/trace.json");
  ASSERT_TRUE(f.good()) << r.output;
  std::stringstream trace;
  trace << f.rdbuf();
  EXPECT_NE(trace.str().find("\"name\": \"mul\""), std::string::npos) << trace.str().substr(0, 500);
  EXPECT_NE(r.output.find("profile of rank 0: " + dir + "/trace.json"), std::string::npos)
      << r.output;
  // Under keel launch each rank writes its own file, also when the program never calls
  // fleet::init (the rank then comes from the launcher's variables).
  auto two =
      RunCommand("cd " + dir + " && " + Keel() + " launch --nproc_per_node=2 --profile=" + dir +
                 "/t.json --log_dir=" + dir + "/log " + BinPath("train_mlp"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_TRUE(std::ifstream(dir + "/t.json.rank0").good()) << two.output;
  EXPECT_TRUE(std::ifstream(dir + "/t.json.rank1").good()) << two.output;
  RunCommand("rm -rf " + dir);
}

TEST(UserProgram, TrainMlpRunsTheSeedProgramAndSaves) {
  std::string dir = MakeTempDir();
  auto r = RunCommand("cd " + dir + " && " + BinPath("train_mlp"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 99 cost="), std::string::npos) << r.output;
  std::ifstream f(dir + "/model/persistables.safetensors");
  EXPECT_TRUE(f.good());
  RunCommand("rm -rf " + dir);
}

}  // namespace
}  // namespace keel::testing
