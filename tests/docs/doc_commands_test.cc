// The commands README.md and docs/*.md show a user are run as written: every ```sh block marked
// with a preceding `<!-- doc-test -->` line runs in a fresh folder with this build's `keel` first
// on PATH (KEEL_SOURCE: the checkout, KEEL_BUILD: the build folder) and must exit 0. So the docs
// cannot drift from the tool.
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/util/golden.h"
#include "tests/util/subprocess.h"

namespace keel::testing {
namespace {

struct DocBlock {
  std::string file;  // relative to the checkout
  int line = 0;      // of the opening ```sh
  std::string script;
};

std::vector<std::string> DocFiles() {
  std::vector<std::string> files = {"README.md"};
  if (DIR* d = ::opendir(SourcePath("docs").c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 3 && n.compare(n.size() - 3, 3, ".md") == 0) files.push_back("docs/" + n);
    }
    ::closedir(d);
  }
  std::sort(files.begin() + 1, files.end());
  return files;
}

std::vector<DocBlock> MarkedBlocks() {
  std::vector<DocBlock> blocks;
  for (const std::string& f : DocFiles()) {
    std::ifstream in(SourcePath(f));
    std::string line;
    bool marked = false;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (line == "<!-- doc-test -->") {
        marked = true;
        continue;
      }
      if (marked && line == "```sh") {
        DocBlock b{f, n, ""};
        while (std::getline(in, line) && line != "```") {
          ++n;
          b.script += line + "\n";
        }
        ++n;
        blocks.push_back(b);
      }
      marked = false;
    }
  }
  return blocks;
}

void PrintTo(const DocBlock& b, std::ostream* os) { *os << b.file << ":" << b.line; }

class DocCommands : public ::testing::TestWithParam<DocBlock> {};

TEST_P(DocCommands, RunAsWritten) {
  const DocBlock& b = GetParam();
  std::string dir = MakeTempDir();
  std::ofstream(dir + "/doc.sh") << "set -eo pipefail\n" << b.script;
  std::string env = "cd " + dir + " && PATH=" + std::string(KEEL_BINARY_DIR) + "/bin:$PATH" +
                    " KEEL_SOURCE=" + std::string(KEEL_SOURCE_DIR) +
                    " KEEL_BUILD=" + std::string(KEEL_BINARY_DIR) + " GLOG_minloglevel=1";
  auto r = RunCommand(env + " bash doc.sh 2>&1");
  EXPECT_EQ(r.exit_code, 0) << b.file << ":" << b.line << "\n" << b.script << "---\n" << r.output;
  RunCommand("rm -rf " + dir);
}

std::string BlockName(const ::testing::TestParamInfo<DocBlock>& info) {
  std::string name = info.param.file + "_" + std::to_string(info.param.line);
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Docs, DocCommands, ::testing::ValuesIn(MarkedBlocks()), BlockName);

TEST(DocCommands, EveryTopicPageHasRunnableCommands) {
  std::vector<DocBlock> blocks = MarkedBlocks();
  for (const char* page : {"README.md", "docs/install.md", "docs/fleet.md", "docs/launching.md",
                           "docs/monitoring.md", "docs/training.md"}) {
    EXPECT_TRUE(std::any_of(blocks.begin(), blocks.end(),
                            [&](const DocBlock& b) { return b.file == page; }))
        << page << " has no <!-- doc-test --> block";
  }
}

}  // namespace
}  // namespace keel::testing
