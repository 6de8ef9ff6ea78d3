// Golden-text comparison: a test prints a program and compares with tests/golden/NAME.
// KEEL_UPDATE_GOLDEN=1 rewrites the files instead (tests/update_goldens.sh does this on purpose).
#pragma once

#include <string>

namespace keel::testing {

// EXPECTs `actual` equals the golden file tests/golden/<name>, showing the first differing line.
void ExpectGolden(const std::string& actual, const std::string& name);

// Absolute path of a file under the source tree.
std::string SourcePath(const std::string& relative);

}  // namespace keel::testing
