#include "framework/comm/ring_model.h"

#include <gflags/gflags.h>
#include <glog/logging.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "framework/comm/communicator.h"

DEFINE_string(ring_model_cache, "",
              "Directory where rank 0 keeps the measured latency and bandwidth of its CPU rings, "
              "from which fused gradient groups are chosen (empty: $XDG_CACHE_HOME/keel or "
              "~/.cache/keel; off: measure at every start, keep nothing).");

namespace keel {

namespace {

// The best of `reps` timed all-reduces of `numel` floats (after one untimed), in seconds.
double BestAllReduce(Communicator& comm, int64_t numel, int reps) {
  Tensor t(DType::kFloat32, DDim({numel}));
  std::fill(t.data<float>(), t.data<float>() + numel, 1.0f);
  comm.AllReduce(&t, ReduceOp::kSum);
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    comm.AllReduce(&t, ReduceOp::kSum);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

RingModel MeasureRingModel(Communicator& comm) {
  constexpr int64_t kSmall = 256, kLarge = 1 << 20;  // 1 KiB and 4 MiB of floats
  const double small = BestAllReduce(comm, kSmall, 20);
  const double large = BestAllReduce(comm, kLarge, 5);
  Tensor m(DType::kFloat64, DDim({2}));
  m.data<double>()[0] = small;
  m.data<double>()[1] = std::max(large - small, 1e-9) / ((kLarge - kSmall) * 4.0);
  comm.AllReduce(&m, ReduceOp::kMax);  // every rank takes the same model
  return RingModel{m.data<double>()[0], m.data<double>()[1]};
}

double GroupBytesFor(const RingModel& model) {
  constexpr double kMin = 64.0 * 1024, kMax = 64.0 * 1024 * 1024;
  if (!(model.alpha_s > 0) || !(model.beta_s_per_byte > 0)) return kMin;
  // alpha <= 0.1 * (alpha + beta * bytes)  <=>  bytes >= 9 * alpha / beta
  const double want = 9.0 * model.alpha_s / model.beta_s_per_byte;
  if (!(want > kMin)) return kMin;
  if (!(want < kMax)) return kMax;
  return std::exp2(std::ceil(std::log2(want)));
}

std::string RingModelCachePath(const std::string& backend, int nranks, int nnodes) {
  std::string dir = FLAGS_ring_model_cache;
  if (dir == "off") return "";
  if (dir.empty()) {
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
      dir = std::string(x) + "/keel";
    } else if (const char* h = std::getenv("HOME"); h && *h) {
      dir = std::string(h) + "/.cache/keel";
    } else {
      return "";
    }
  }
  return dir + "/ring-model-" + backend + "-" + std::to_string(nranks) + "r" +
         std::to_string(nnodes) + "n.txt";
}

std::optional<RingModel> LoadRingModel(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  std::istringstream is(line);
  RingModel m;
  if (!(is >> m.alpha_s >> m.beta_s_per_byte) || !(m.alpha_s > 0 && m.alpha_s < 1) ||
      !(m.beta_s_per_byte > 0 && m.beta_s_per_byte < 1e-3)) {
    LOG(WARNING) << "ring model cache " << path << " holds '" << line.substr(0, 80)
                 << "', not two positive numbers (alpha in s, beta in s per byte); measuring the "
                    "ring again";
    return std::nullopt;
  }
  return m;
}

void SaveRingModel(const std::string& path, const RingModel& model) {
  if (path.empty()) return;
  const std::string dir = path.substr(0, path.rfind('/'));
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  bool ok = false;
  {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    std::ofstream out(tmp);
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%.9g %.9g\n", model.alpha_s, model.beta_s_per_byte);
    out << buf;
    out.close();
    ok = !ec && out.good() && std::rename(tmp.c_str(), path.c_str()) == 0;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    LOG(WARNING) << "could not keep the ring model in " << path
                 << " (--ring_model_cache): it will be measured again next time";
  }
}

}  // namespace keel
