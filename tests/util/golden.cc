#include "tests/util/golden.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace keel::testing {

std::string SourcePath(const std::string& relative) {
#ifdef KEEL_SOURCE_DIR
  return std::string(KEEL_SOURCE_DIR) + "/" + relative;
#else
  const char* root = std::getenv("KEEL_SOURCE_DIR");
  return std::string(root ? root : ".") + "/" + relative;
#endif
}

void ExpectGolden(const std::string& actual, const std::string& name) {
  std::string path = SourcePath("tests/golden/" + name);
  const char* update = std::getenv("KEEL_UPDATE_GOLDEN");
  if (update && std::string(update) == "1") {
    std::ofstream(path) << actual;
    return;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "missing golden file " << path
                         << " (run tests/update_goldens.sh to create it)";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string expected = ss.str();
  if (expected == actual) return;
  std::istringstream a(actual), e(expected);
  std::string la, le;
  int line = 0;
  while (true) {
    ++line;
    bool ga = static_cast<bool>(std::getline(a, la));
    bool ge = static_cast<bool>(std::getline(e, le));
    if (!ga && !ge) break;
    if (la != le || ga != ge) {
      ADD_FAILURE() << "program differs from " << path << " at line " << line
                    << "\n  expected: " << (ge ? le : "<end>")
                    << "\n  actual:   " << (ga ? la : "<end>") << "\nfull actual text:\n"
                    << actual;
      return;
    }
  }
}

}  // namespace keel::testing
