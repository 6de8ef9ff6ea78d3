// Runs every collective op on every dtype through real programs, on the ranks `keel launch` gives,
// and checks the results against values computed locally. Exit 0 when all match; 1 with the first
// mismatch otherwise. Used by tests/comm/collective_ops_test.cc.
#include <keel/keel.h>

#include <cstdio>

#include "fleet/fleet.h"

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
void RunAll(DType dtype, int ring) {
  const int rank = fleet::worker_index(), n = fleet::worker_num();
  const int64_t len = 6 * n;  // divisible for reduce-scatter
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
  for (std::string op : {"c_allreduce_sum", "c_allreduce_max", "c_allreduce_min",
                         "c_allreduce_prod", "c_broadcast"})
    AppendOp(b, op, {{"X", {"x"}}}, {{"Out", {var(op + "_out", {len})}}},
             op == "c_broadcast" ? std::map<std::string, Attribute>{{"ring_id", ring}, {"root", n - 1}}
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
  std::string tag = std::string(DTypeName(dtype)) + " ring " + std::to_string(ring);
  for (int64_t i = 0; i < len; ++i) {
    T sum = 0, mx = value(0, i), mn = value(0, i), prod = 1;
    for (int r = 0; r < n; ++r) {
      sum += value(r, i);
      mx = std::max(mx, value(r, i));
      mn = std::min(mn, value(r, i));
      prod *= value(r, i);
    }
    Expect(out[0].template data<T>()[i] == sum, tag + " allreduce_sum[" + std::to_string(i) + "]");
    Expect(out[1].template data<T>()[i] == mx, tag + " allreduce_max");
    Expect(out[2].template data<T>()[i] == mn, tag + " allreduce_min");
    Expect(out[3].template data<T>()[i] == prod, tag + " allreduce_prod");
    Expect(out[4].template data<T>()[i] == value(n - 1, i), tag + " broadcast");
  }
  for (int r = 0; r < n; ++r)
    for (int64_t i = 0; i < len; ++i)
      Expect(out[5].template data<T>()[r * len + i] == value(r, i), tag + " allgather");
  for (int64_t i = 0; i < len / n; ++i)
    Expect(out[6].template data<T>()[i] == out[0].template data<T>()[rank * (len / n) + i], tag + " reducescatter");
}

}  // namespace

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  try {
    fleet::init();
    const int n = fleet::worker_num();
    Program startup;
    for (int ring = 0; ring < 2; ++ring)
      AppendOp(startup.global_block(), "c_comm_init", {}, {},
               {{"ring_id", ring}, {"nranks", n}, {"rank", fleet::worker_index()}});
    Executor exe;
    exe.Run(startup);
    for (int ring = 0; ring < 2; ++ring) {
      RunAll<float>(DType::kFloat32, ring);
      RunAll<double>(DType::kFloat64, ring);
      RunAll<int64_t>(DType::kInt64, ring);
      RunAll<int32_t>(DType::kInt32, ring);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", fleet::initialized() ? fleet::worker_index() : -1,
                 e.what());
    return 1;
  }
  if (g_failures) return 1;
  std::printf("rank %d: all collectives match\n", fleet::worker_index());
  return 0;
}
