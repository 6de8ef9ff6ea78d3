#include "tests/util/test_data.h"

#include <sys/stat.h>

#include <cstdlib>

namespace keel::testing {

std::string MnistDir() {
  const char* env = std::getenv("KEEL_MNIST_DIR");
  if (env != nullptr && *env != '\0') return env;
  return std::string(KEEL_SOURCE_DIR) + "/../shared/data/mnist";
}

bool HaveMnist() {
  struct stat st;
  const std::string d = MnistDir();
  return ::stat((d + "/t10k-images-idx3-ubyte.gz").c_str(), &st) == 0 &&
         ::stat((d + "/t10k-labels-idx1-ubyte.gz").c_str(), &st) == 0;
}

}  // namespace keel::testing
