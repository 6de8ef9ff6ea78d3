// `keel COMMAND --help`: the command's flags in groups, one entry each with its default and
// gflags' own description (so help cannot drift from the flags). Flags defined in a command's
// own source files that no group lists still appear, under "other". `--helpfull` stays gflags'
// complete listing (glog's and the library's flags too).
#pragma once

#include <string>

namespace keel {
namespace cli {

// Help of `command` (train | inspect | bench | launch); "" for an unknown command.
std::string CommandHelp(const std::string& command);

}  // namespace cli
}  // namespace keel
