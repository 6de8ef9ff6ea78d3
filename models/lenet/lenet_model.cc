#include "models/lenet/lenet_model.h"

#include <memory>

#include "framework/dsl/nn_layers.h"
#include "framework/dsl/pipeline.h"
#include "framework/dsl/tensor_layers.h"
#include "framework/error.h"

namespace keel {
namespace models {

ClassifierOutputs lenet(Var image, Var label, int classes, int pp_degree) {
  KEEL_ENFORCE(pp_degree >= 1 && pp_degree <= 5, "lenet: pipeline degree ", pp_degree,
               " must be 1..5 (lenet has 5 layers to place on stages)");
  // Without a pipeline no stage is marked: the ops are those of the plain model.
  std::unique_ptr<PipelineStageGuard> s;
  auto layer = [&](int i) {
    if (pp_degree == 1) return;
    s.reset();  // the previous stage's guard first: guards restore what they found
    s = std::make_unique<PipelineStageGuard>(i * pp_degree / 5);
  };
  // [N,1,28,28] -> conv 5x5 pad 2 -> [N,6,28,28] -> pool -> [N,6,14,14]
  layer(0);
  Var h = layers::conv2d(image, 6, 5, 1, 2, 1, 1, "relu");
  h = layers::pool2d(h, 2, "max", 2);
  // -> conv 5x5 -> [N,16,10,10] -> pool -> [N,16,5,5]
  layer(1);
  h = layers::conv2d(h, 16, 5, 1, 0, 1, 1, "relu");
  h = layers::pool2d(h, 2, "max", 2);
  layer(2);
  h = layers::fc(h, 120, "relu");  // flattens [16,5,5]
  layer(3);
  h = layers::fc(h, 84, "relu");
  layer(4);
  Var logits = layers::fc(h, classes);
  Var loss = layers::mean(layers::softmax_with_cross_entropy(logits, label));
  Var acc = layers::accuracy(layers::softmax(logits), label, 1);
  return {logits, loss, acc};
}

}  // namespace models
}  // namespace keel
