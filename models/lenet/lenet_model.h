// LeNet-5 for 28x28 grey images (MNIST): conv5-pool-conv5-pool-fc120-fc84-fc10.
#pragma once

#include "framework/dsl/layers.h"

namespace keel {
namespace models {

struct ClassifierOutputs {
  Var logits, loss, accuracy;
};

// image: [N, 1, 28, 28] float32, label: [N, 1] int64.
ClassifierOutputs lenet(Var image, Var label, int classes = 10);

}  // namespace models
}  // namespace keel
