// keel inspect FILE|DIR: a program as text, a safetensors file as a table, a checkpoint dir as both.
#include <sys/stat.h>

#include <gflags/gflags.h>

#include <cstdio>

#include "framework/error.h"
#include "framework/io/io.h"
#include "python_free_cli/commands.h"

DEFINE_bool(dot, false, "keel inspect: print a program as a Graphviz digraph instead of text.");

namespace keel {
namespace cli {

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void PrintTensors(const std::string& path) {
  std::map<std::string, std::string> meta;
  NamedTensors ts = LoadSafetensors(path, &meta);
  std::printf("# %s: %zu tensors\n", path.c_str(), ts.size());
  for (auto& kv : meta) std::printf("# %s = %s\n", kv.first.c_str(), kv.second.c_str());
  for (auto& [name, t] : ts)
    std::printf("%s : %s%s\n", name.c_str(), DTypeName(t.dtype()), t.dims().str().c_str());
}

void PrintProgram(const std::string& path) {
  auto program = LoadProgram(path);
  std::fputs((FLAGS_dot ? program->ToDot() : program->ToText()).c_str(), stdout);
}

}  // namespace

int Inspect(const std::vector<std::string>& args) {
  KEEL_ENFORCE(args.size() == 1, "inspect takes one FILE or DIR, got ", args.size(), " arguments");
  const std::string& path = args[0];
  struct stat st;
  KEEL_ENFORCE(::stat(path.c_str(), &st) == 0, path, ": no such file or directory");
  if (S_ISDIR(st.st_mode)) {
    bool any = false;
    for (const std::string& f : {kModelFile, kParamsFile, kPersistablesFile}) {
      std::string p = path + "/" + f;
      if (::stat(p.c_str(), &st) != 0) continue;
      any = true;
      if (f == kModelFile) PrintProgram(p);
      else PrintTensors(p);
    }
    KEEL_ENFORCE(any, path, ": holds none of ", kModelFile, ", ", kParamsFile, ", ",
                 kPersistablesFile);
    return 0;
  }
  if (EndsWith(path, ".safetensors")) PrintTensors(path);
  else PrintProgram(path);
  return 0;
}

}  // namespace cli
}  // namespace keel
