#include <keel/keel.h>

int main(int argc, char** argv) {
  keel::Init(&argc, &argv);
  keel::Program program;
  return program.num_blocks() == 1 ? 0 : 1;
}
