// <keel/keel.h> alone gives a user program everything it needs: the DSL, the executor, fleet and
// the data API (this file includes nothing else of keel's).
#include <gtest/gtest.h>
#include <keel/keel.h>

namespace keel {
namespace {

TEST(KeelHeader, AFleetProgramFedByADataLoaderBuildsWithTheOneHeader) {
  fleet::reset();
  fleet::init(fleet::UserDefinedRoleMaker(0, 1));
  Program main, startup;
  startup.set_random_seed(1);
  ProgramGuard guard(main, startup);
  Var x = layers::data("x", {-1, 32});
  Var y = layers::data("y", {-1, 1}, DType::kInt64);
  Var h = layers::fc(x, 8, "tanh");
  Var loss = layers::mean(layers::cross_entropy(layers::fc(h, 2, "softmax"), y));
  fleet::DistributedStrategy strategy;
  fleet::distributed_optimizer(optimizer::SGD(0.1f), strategy).minimize(loss, &startup);

  LoaderOptions opts;
  opts.batch_size = 16;
  opts.rank = fleet::worker_index();
  opts.nranks = fleet::worker_num();
  Tensor xs(DType::kFloat32, {64, 32}), ys(DType::kInt64, {64, 1});
  for (int64_t i = 0; i < xs.numel(); ++i) xs.data<float>()[i] = static_cast<float>(i % 7) / 7;
  for (int64_t i = 0; i < ys.numel(); ++i) ys.data<int64_t>()[i] = i % 2;
  DataLoader loader(std::make_shared<TensorDataset>(std::vector<std::string>{"x", "y"},
                                                    std::vector<Tensor>{xs, ys}),
                    opts);
  Executor exe(fleet::worker_place());
  exe.Run(startup);
  FeedMap batch;
  int steps = 0;
  while (loader.Next(&batch)) {
    auto out = exe.Run(fleet::main_program(), batch, {loss.name()});
    ASSERT_EQ(out.size(), 1u);
    ++steps;
  }
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(fleet::metrics::acc(3, 4), 0.75);
  fleet::reset();
}

}  // namespace
}  // namespace keel
