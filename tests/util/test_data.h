// Where the tests find data that is not in the repository.
#pragma once

#include <string>

namespace keel::testing {

// The MNIST directory (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz): $KEEL_MNIST_DIR, or
// by default shared/data/mnist beside the checkout. Tests that need it skip, saying where they
// looked, when it is absent (HaveMnist).
std::string MnistDir();
bool HaveMnist();

}  // namespace keel::testing
