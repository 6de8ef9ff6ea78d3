#include "tests/util/worker_run.h"

#include <gtest/gtest.h>

#include "framework/io/checkpoint.h"
#include "tests/util/subprocess.h"

namespace keel::testing {

Trained TrainWorker(const std::string& worker, int nranks, const std::string& dir,
                    const std::string& flags) {
  const std::string run = BinPath(worker) + " --out=" + dir + "/save" + flags;
  const std::string cmd = nranks == 1 ? run
                                      : "FLAGS_cpu_math_threads=1 " + Keel() +
                                            " launch --nproc_per_node=" + std::to_string(nranks) +
                                            " --log_dir=" + dir + "/log sh -c '" + run + "'; cat " +
                                            dir + "/log/workerlog.*";
  auto r = RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  Trained out;
  out.output = r.output;
  if (r.exit_code == 0) out.saved = LoadSafetensors(dir + "/save/" + kPersistablesFile);
  return out;
}

}  // namespace keel::testing
