// ResNet-20 for 32x32x3 images (He et al. 2016, CIFAR variant): a 3x3 conv, three stages of three
// basic blocks (16, 32, 64 channels; stride 2 entering stages 2 and 3, with 1x1 projection
// shortcuts), global average pooling and a classifier.
#pragma once

#include <string>

#include "models/lenet/lenet_model.h"

namespace keel {
namespace models {

// image: [N, 3, 32, 32] float32, label: [N, 1] int64. depth = 6n + 2 (20: n = 3).
// pp_degree > 1 places the network on that many pipeline stages (docs/pipeline.md): the stem with
// block 0, block j of the 3n on stage j * S / 3n, pooling, classifier, loss and accuracy with the
// last block. Under a TensorParallelGuard each basic block's convolutions split over the group
// (resnet_model.cc); the degree must divide 16. data_format "NHWC": the images are transposed
// once and every convolution, batch norm and the pooling run channels last (the same parameters,
// the same function up to rounding).
ClassifierOutputs resnet_cifar(Var image, Var label, int depth = 20, int classes = 10,
                               int pp_degree = 1, const std::string& data_format = "NCHW");

}  // namespace models
}  // namespace keel
