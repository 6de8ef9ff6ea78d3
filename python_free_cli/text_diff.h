// A line diff of two texts (Myers' O((N+M)D) shortest edit script), printed as hunks with one
// line of context: "@@ -a,n +b,m @@", then " kept", "-removed", "+added" lines. keel inspect
// --diff uses it to show what the transpiler changed in a program's text form.
#pragma once

#include <string>

namespace keel {
namespace cli {

// "" when the texts are equal.
std::string LineDiff(const std::string& before, const std::string& after, int context = 1);

}  // namespace cli
}  // namespace keel
