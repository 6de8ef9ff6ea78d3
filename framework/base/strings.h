// Strings: trim, split and join, as keel's flag, environment and file parsers and its messages
// use them. framework/base is keel's lowest layer: it includes nothing of keel but
// framework/error.h, so that every other folder may use it.
#pragma once

#include <string>
#include <vector>

namespace keel {

// `s` without the spaces and tabs at either end.
std::string StrTrim(const std::string& s);

// "a,,b" -> {"a", "", "b"}, "" -> {""}: every separator splits, so that the caller sees an empty
// entry (and refuses or skips it) rather than having it dropped silently.
std::vector<std::string> StrSplit(const std::string& s, char sep);

// {"a", "b"} -> "a<sep>b"; {} -> "".
std::string StrJoin(const std::vector<std::string>& parts, const std::string& sep);
std::string StrJoin(const std::vector<int>& parts, const std::string& sep);

}  // namespace keel
