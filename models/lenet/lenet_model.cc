#include "models/lenet/lenet_model.h"

#include "framework/dsl/nn_layers.h"
#include "framework/dsl/tensor_layers.h"

namespace keel {
namespace models {

ClassifierOutputs lenet(Var image, Var label, int classes) {
  // [N,1,28,28] -> conv 5x5 pad 2 -> [N,6,28,28] -> pool -> [N,6,14,14]
  Var h = layers::conv2d(image, 6, 5, 1, 2, 1, 1, "relu");
  h = layers::pool2d(h, 2, "max", 2);
  // -> conv 5x5 -> [N,16,10,10] -> pool -> [N,16,5,5]
  h = layers::conv2d(h, 16, 5, 1, 0, 1, 1, "relu");
  h = layers::pool2d(h, 2, "max", 2);
  h = layers::fc(h, 120, "relu");  // flattens [16,5,5]
  h = layers::fc(h, 84, "relu");
  Var logits = layers::fc(h, classes);
  Var loss = layers::mean(layers::softmax_with_cross_entropy(logits, label));
  Var acc = layers::accuracy(layers::softmax(logits), label, 1);
  return {logits, loss, acc};
}

}  // namespace models
}  // namespace keel
