// framework/io under faults: a writer killed at any point leaves no temp file that later saves
// keep, an inference model directory always holds a pair that loads (the old model or the new),
// a file size limit is an error naming the file (never SIGXFSZ), and a training checkpoint resumes
// a run (Adam with an LR schedule, dropout) bit for bit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "executor/executor.h"
#include "executor/executor_io.h"
#include "framework/dsl/layers.h"
#include "framework/dsl/lr_schedule.h"
#include "framework/dsl/nn_layers.h"
#include "framework/dsl/optimizer.h"
#include "framework/dsl/program_guard.h"
#include "framework/error.h"
#include "framework/io/atomic_file.h"
#include "framework/io/checkpoint.h"
#include "tests/util/files.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

using testing::DirEntries;
using testing::TensorBytes;

class CrashTest : public testing::TempDirTest {};

// Runs `body` in a child process with KEEL_FAULT_POINT=point; true when the child died of
// SIGKILL at it.
bool KilledAt(const std::string& point, const std::function<void()>& body) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("KEEL_FAULT_POINT", point.c_str(), 1);
    try {
      body();
    } catch (...) {
      _exit(3);
    }
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

// ---------------------------------------------------------------- atomic files

TEST_F(CrashTest, AWriterKilledMidWriteLeavesNoTempFile) {
  const std::string path = Path("persistables.safetensors");
  WriteFileAtomic(path, "old");
  ASSERT_TRUE(
      KilledAt("write_file_atomic", [&] { WriteFileAtomic(path, std::string(1 << 20, 'n')); }));
  EXPECT_EQ(DirEntries(dir_), std::vector<std::string>{"persistables.safetensors"});
  EXPECT_EQ(ReadFile(path), "old");
}

TEST_F(CrashTest, TempFilesOfDeadWritersAreRemovedByTheNextSave) {
  const std::string path = Path("persistables.safetensors");
  // What a writer killed between its link and its rename leaves: a named temp of a dead pid.
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string stale =
      Path(".persistables.safetensors.tmp.0123abcd." + std::to_string(dead) + "@" + host);
  const std::string live =
      Path(".persistables.safetensors.tmp.0123abce." + std::to_string(getpid()) + "@" + host);
  const std::string other_host = Path(".persistables.safetensors.tmp.0123abcf.1@elsewhere");
  for (const auto& p : {stale, live, other_host}) std::ofstream(p) << std::string(4096, 'x');
  WriteFileAtomic(path, "new");
  EXPECT_FALSE(fs::exists(stale)) << "a dead writer's temp file survived the next save";
  EXPECT_TRUE(fs::exists(live)) << "a live writer's temp file was removed";
  EXPECT_TRUE(fs::exists(other_host)) << "another host's temp file was removed";
}

TEST_F(CrashTest, AFileSizeLimitIsAnErrorNamingTheFileNotSigxfsz) {
  const std::string path = Path("big.bin");
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_DFL);  // as in a fresh process: keel must not die of it
    rlimit rl{8192, 8192};
    setrlimit(RLIMIT_FSIZE, &rl);
    try {
      WriteFileAtomic(path, std::string(1 << 20, 'x'));
    } catch (const Error& e) {
      std::string m = e.what();
      _exit(m.find(path) != std::string::npos && m.find("ulimit -f") != std::string::npos ? 7 : 8);
    }
    _exit(9);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 7);
  EXPECT_TRUE(DirEntries(dir_).empty());
}

TEST_F(CrashTest, CheckCanWriteRefusesUnusableDirectoriesByFlagName) {
  std::ofstream(Path("file")) << "x";
  try {
    CheckCanWrite(Path("file") + "/sub", 100, "--save_dir");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--save_dir=" + Path("file") + "/sub"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(CheckCanWrite("/proc/keel_no_such_dir", 100, "--save_dir"), Error);
  CheckCanWrite(Path("ok"), 100, "--save_dir");
  EXPECT_TRUE(DirEntries(Path("ok")).empty()) << "the probe file was left behind";
}

// A check killed between creating its probe file and removing it leaves the probe; the next check
// in that directory removes it (its writer's pid is dead), so none stays for good.
TEST_F(CrashTest, AProbeLeftByAKilledWriteCheckIsRemovedByTheNext) {
  const std::string dir = Path("save");
  ASSERT_TRUE(KilledAt("write_check", [&] { CheckCanWrite(dir, 100, "--save_dir"); }));
  ASSERT_EQ(DirEntries(dir).size(), 1u) << "the killed check left no probe to clean up";
  CheckCanWrite(dir, 100, "--save_dir");
  EXPECT_TRUE(DirEntries(dir).empty()) << DirEntries(dir)[0];
}

// ---------------------------------------------------------------- inference models

struct Model {
  std::unique_ptr<Program> main, startup;
  std::string x, y;
};

Model SmallModel() {
  Model m;
  m.main = std::make_unique<Program>();
  m.startup = std::make_unique<Program>();
  m.main->set_random_seed(3);
  m.startup->set_random_seed(3);
  ProgramGuard guard(*m.main, *m.startup);
  Var x = layers::data("x", {-1, 4}, DType::kFloat32);
  Var y = layers::fc(layers::fc(x, 8, "relu"), 2);
  m.x = x.name();
  m.y = y.name();
  return m;
}

// The values of every param of the model in `exe`, by name.
std::map<std::string, std::string> Params(Executor& exe, const Program& p) {
  std::map<std::string, std::string> out;
  for (const VarDesc* v : p.global_block().AllVars())
    if (v->persistable() && exe.scope().FindVar(v->name()))
      out[v->name()] = TensorBytes(exe.scope().FindVar(v->name())->tensor());
  return out;
}

// A save killed between linking the previous checkpoint and renaming it leaves its temp name;
// the next save removes it (its writer is dead), and the checkpoints are sound.
TEST_F(CrashTest, ASaveKilledWhileKeepingThePreviousLeavesNothingForGood) {
  Model m = SmallModel();
  Executor exe;
  exe.Run(*m.startup);
  const std::string dir = Path("ckpt");
  save_checkpoint(exe.scope(), dir, *m.main, TrainingState{5, 7, 1, {}});
  ASSERT_TRUE(KilledAt("checkpoint_keep_previous", [&] {
    save_checkpoint(exe.scope(), dir, *m.main, TrainingState{10, 7, 1, {}});
  }));
  ASSERT_EQ(DirEntries(dir).size(), 2u) << "no temp name was left to clean up";
  EXPECT_EQ(ReadTrainingState(dir)->step, 5);
  save_checkpoint(exe.scope(), dir, *m.main, TrainingState{10, 7, 1, {}});
  EXPECT_EQ(DirEntries(dir),
            (std::vector<std::string>{kPreviousPersistablesFile, kPersistablesFile}));
  EXPECT_EQ(ReadTrainingState(dir)->step, 10);
}

// A save killed while writing the latest leaves the previous and the latest as two names of one
// file (the link is renamed, the new latest is not). The next save's link-and-rename of the
// previous then renames a name over itself, which succeeds and does nothing: the temp name must
// still go, though its writer (this process) is alive.
TEST_F(CrashTest, ASaveAfterOneKilledWritingTheLatestLeavesNoTempName) {
  Model m = SmallModel();
  Executor exe;
  exe.Run(*m.startup);
  const std::string dir = Path("ckpt");
  save_checkpoint(exe.scope(), dir, *m.main, TrainingState{5, 7, 1, {}});
  ASSERT_TRUE(KilledAt("write_file_atomic", [&] {
    save_checkpoint(exe.scope(), dir, *m.main, TrainingState{10, 7, 1, {}});
  }));
  struct stat a, b;
  ASSERT_EQ(::stat((dir + "/" + kPersistablesFile).c_str(), &a), 0);
  ASSERT_EQ(::stat((dir + "/" + kPreviousPersistablesFile).c_str(), &b), 0);
  ASSERT_EQ(a.st_ino, b.st_ino) << "the killed save did not leave one file under both names";
  save_checkpoint(exe.scope(), dir, *m.main, TrainingState{10, 7, 1, {}});
  EXPECT_EQ(DirEntries(dir),
            (std::vector<std::string>{kPreviousPersistablesFile, kPersistablesFile}));
  EXPECT_EQ(ReadTrainingState(dir)->step, 10);
}

// save_checkpoint keeps the one it replaces; a damaged latest checkpoint (one flipped byte) loads
// the previous one, saying so; with both damaged the error names the latest.
TEST_F(CrashTest, ADamagedLatestCheckpointFallsBackToThePreviousSayingSo) {
  Model m = SmallModel();
  Executor exe;
  exe.Run(*m.startup);
  const std::string dir = Path("ckpt");
  const std::map<std::string, std::string> at5 = Params(exe, *m.main);
  save_checkpoint(exe.scope(), dir, *m.main, TrainingState{5, 7, 1, {}});
  for (const VarDesc* v : m.main->global_block().AllVars())  // other values for the next save
    if (v->persistable()) {
      Tensor* t = exe.scope().FindVar(v->name())->mutable_tensor();
      for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] += 1.f;
    }
  save_checkpoint(exe.scope(), dir, *m.main, TrainingState{10, 7, 1, {}});
  ASSERT_EQ(DirEntries(dir),
            (std::vector<std::string>{kPreviousPersistablesFile, kPersistablesFile}));
  EXPECT_EQ(ReadTrainingState(dir)->step, 10);

  const std::string latest = dir + "/" + kPersistablesFile;
  std::string bytes = ReadFile(latest);
  bytes[bytes.size() - 3] ^= 0x40;  // a data byte: the checksum catches it
  { std::ofstream(latest, std::ios::binary) << bytes; }
  Executor fresh;
  fresh.Run(*m.startup);
  ::testing::internal::CaptureStderr();
  std::optional<TrainingState> st = load_checkpoint(fresh, dir, *m.main);
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->step, 5);
  EXPECT_EQ(ReadTrainingState(dir)->step, 5);
  EXPECT_EQ(Params(fresh, *m.main), at5);
  EXPECT_NE(said.find("loading the previous one"), std::string::npos) << said;
  EXPECT_NE(said.find(latest), std::string::npos) << said;
  // The damaged file is set aside: the next save keeps the sound one as its previous.
  EXPECT_EQ(DirEntries(dir),
            (std::vector<std::string>{kPreviousPersistablesFile, kPersistablesFile + ".damaged"}));
  save_checkpoint(fresh.scope(), dir, *m.main, TrainingState{6, 7, 1, {}});
  EXPECT_EQ(ReadTrainingState(dir)->step, 6);
  ASSERT_EQ(std::rename((latest + ".damaged").c_str(), latest.c_str()), 0);  // damaged again

  const std::string prev = dir + "/" + kPreviousPersistablesFile;
  std::string prev_bytes = ReadFile(prev);
  prev_bytes[prev_bytes.size() - 3] ^= 0x40;
  { std::ofstream(prev, std::ios::binary) << prev_bytes; }
  try {
    load_checkpoint(fresh, dir, *m.main);
    ADD_FAILURE() << "two damaged checkpoints loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(latest), std::string::npos) << e.what();
  }
}

void Perturb(Executor& exe, const Program& p, float delta) {
  for (const VarDesc* v : p.global_block().AllVars()) {
    if (!v->persistable()) continue;
    Tensor* t = exe.scope().FindVar(v->name())->mutable_tensor();
    float* d = t->data<float>();
    for (int64_t i = 0; i < t->numel(); ++i) d[i] += delta;
  }
}

// Kill points all through a publish: each leaves a directory that loads the old model (before
// the commit) or the new one (after it), complete, and the next save cleans up.
TEST_F(CrashTest, InferenceModelKilledAnywhereLoadsTheOldOrTheNewPair) {
  Model m = SmallModel();
  Executor exe;
  exe.Run(*m.startup);
  const std::string dir = Path("infer");
  save_inference_model(dir, {m.x}, {m.y}, exe, *m.main);
  const auto old_params = Params(exe, *m.main);
  Perturb(exe, *m.main, 1.0f);
  const auto new_params = Params(exe, *m.main);
  ASSERT_NE(old_params, new_params);

  struct Case {
    const char* point;
    bool expect_new;
  };
  for (Case c : {Case{"write_file_atomic", false}, Case{"inference_after_commit", true},
                 Case{"inference_between_renames", true}}) {
    SCOPED_TRACE(c.point);
    ASSERT_TRUE(KilledAt(c.point, [&] { save_inference_model(dir, {m.x}, {m.y}, exe, *m.main); }));
    Executor reader;
    InferenceModel loaded = load_inference_model(dir, reader);
    std::map<std::string, std::string> got;
    for (const auto& [name, bytes] : old_params)
      got[name] = TensorBytes(reader.scope().FindVar(name)->tensor());
    EXPECT_EQ(got, c.expect_new ? new_params : old_params);
    // Put the old pair back for the next case (and check that a full save cleans up).
    Executor restore;
    restore.Run(*m.startup);
    save_inference_model(dir, {m.x}, {m.y}, restore, *m.main);
    EXPECT_EQ(DirEntries(dir), (std::vector<std::string>{"__model__", "params.safetensors"}));
  }
}

TEST_F(CrashTest, AMismatchedInferencePairIsRefusedNamingBothFiles) {
  Model a = SmallModel();
  Executor exe;
  exe.Run(*a.startup);
  save_inference_model(Path("a"), {a.x}, {a.y}, exe, *a.main);
  // Another model's __model__ next to a's params: what renaming the two files separately left.
  Model b = SmallModel();
  {
    ProgramGuard guard(*b.main, *b.startup);
    b.y = layers::scale(Var(&b.main->global_block(), b.y), 2.0f).name();
  }
  Executor exe_b;
  exe_b.Run(*b.startup);
  save_inference_model(Path("b"), {b.x}, {b.y}, exe_b, *b.main);
  fs::copy_file(Path("b/__model__"), Path("a/__model__"), fs::copy_options::overwrite_existing);
  Executor reader;
  try {
    load_inference_model(Path("a"), reader);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("belong to different saves"), std::string::npos) << msg;
    EXPECT_NE(msg.find(Path("a") + "/__model__"), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------- exact resume

// fc -> dropout -> fc, Adam under a warm-up + cosine schedule: every piece of state a resume must
// carry (moments, beta powers, the schedule's counter, dropout's draws).
struct TrainModel {
  std::unique_ptr<Program> main, startup;
  std::string loss;
};

TrainModel DropoutAdamModel() {
  TrainModel m;
  m.main = std::make_unique<Program>();
  m.startup = std::make_unique<Program>();
  m.main->set_random_seed(11);
  m.startup->set_random_seed(11);
  ProgramGuard guard(*m.main, *m.startup);
  Var x = layers::data("x", {-1, 6}, DType::kFloat32);
  Var label = layers::data("label", {-1, 1}, DType::kInt64);
  Var h = layers::dropout(layers::fc(x, 16, "relu"), 0.3f);
  Var logits = layers::fc(h, 3);
  Var loss = layers::mean(layers::softmax_with_cross_entropy(logits, label));
  optimizer::Adam(lr_schedule::LinearWarmup(lr_schedule::Cosine(0.01f, 40), 5))
      .minimize(loss, m.startup.get());
  m.loss = loss.name();
  return m;
}

FeedMap Batch(int step) {
  FeedMap f;
  float* x = static_cast<float*>(f["x"].Alloc(DType::kFloat32, {8, 6}));
  int64_t* y = static_cast<int64_t*>(f["label"].Alloc(DType::kInt64, {8, 1}));
  for (int i = 0; i < 8 * 6; ++i) x[i] = static_cast<float>(((step * 31 + i * 7) % 17) - 8) / 8.f;
  for (int i = 0; i < 8; ++i) y[i] = (step + i) % 3;
  return f;
}

TEST_F(CrashTest, ResumedTrainingEqualsTheStraightRunBitForBit) {
  const int kSteps = 20, kCut = 9;
  // Straight.
  TrainModel a = DropoutAdamModel();
  Executor ea;
  ea.Run(*a.startup);
  std::vector<std::string> straight_losses;
  for (int s = 0; s < kSteps; ++s)
    straight_losses.push_back(TensorBytes(ea.Run(*a.main, Batch(s), {a.loss})[0]));

  // Interrupted after kCut steps, resumed by a fresh process's worth of objects.
  TrainModel b = DropoutAdamModel();
  {
    Executor eb;
    eb.Run(*b.startup);
    for (int s = 0; s < kCut; ++s) eb.Run(*b.main, Batch(s), {b.loss});
    TrainingState st;
    st.step = kCut;
    st.seed = 11;
    st.extra["note"] = "cut";
    save_checkpoint(eb.scope(), Path("ckpt"), *b.main, st);
  }
  std::optional<TrainingState> read = ReadTrainingState(Path("ckpt"));
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->step, kCut);
  EXPECT_EQ(read->seed, 11u);
  EXPECT_EQ(read->extra.at("note"), "cut");

  TrainModel c = DropoutAdamModel();
  Executor ec;
  ec.Run(*c.startup);
  std::optional<TrainingState> st = load_checkpoint(ec, Path("ckpt"), *c.main);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(ec.RunCount(*c.main), kCut);
  for (int s = kCut; s < kSteps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    EXPECT_EQ(TensorBytes(ec.Run(*c.main, Batch(s), {c.loss})[0]), straight_losses[s]);
  }
  EXPECT_EQ(Params(ec, *c.main), Params(ea, *a.main));
}

// Without the run count, dropout would redraw step 0's masks after a resume: the test above
// depends on it, so pin that dropout's draws are a function of the run index.
TEST_F(CrashTest, DropoutDrawsDependOnTheRunIndexOnly) {
  TrainModel a = DropoutAdamModel(), b = DropoutAdamModel();
  Executor ea, eb;
  ea.Run(*a.startup);
  eb.Run(*b.startup);
  eb.SetRunCount(*b.main, 5);
  for (int s = 0; s < 5; ++s) ea.Run(*a.main, Batch(s), {a.loss});
  // Same parameters, same run index 5: the same dropout mask, so the same loss.
  for (const VarDesc* v : a.main->global_block().AllVars())
    if (v->persistable())
      eb.scope().Var(v->name())->mutable_tensor()->CopyFrom(
          ea.scope().FindVar(v->name())->tensor());
  EXPECT_EQ(TensorBytes(ea.Run(*a.main, Batch(5), {a.loss})[0]),
            TensorBytes(eb.Run(*b.main, Batch(5), {b.loss})[0]));
}

}  // namespace
}  // namespace keel
