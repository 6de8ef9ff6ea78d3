// LeNet-5 for 28x28 grey images (MNIST): conv5-pool-conv5-pool-fc120-fc84-fc10.
#pragma once

#include "framework/dsl/layers.h"

namespace keel {
namespace models {

struct ClassifierOutputs {
  Var logits, loss, accuracy;
};

// image: [N, 1, 28, 28] float32, label: [N, 1] int64. pp_degree > 1 (at most 5) places the
// network on that many pipeline stages (docs/pipeline.md): of its five layers (the two
// convolutions with their pooling, the three fc layers; the loss and accuracy with the last),
// layer i on stage i * S / 5.
ClassifierOutputs lenet(Var image, Var label, int classes = 10, int pp_degree = 1);

}  // namespace models
}  // namespace keel
