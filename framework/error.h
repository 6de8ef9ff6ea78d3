// keel::Error: the one exception type for bad user input, files, env and network.
// Internal invariants use glog's CHECK instead.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace keel {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string StrCat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Builds a message from streamable pieces: StrCat("op ", type, ": ", n).
template <typename... Args>
std::string StrCat(Args&&... args) {
  return detail::StrCat(std::forward<Args>(args)...);
}

}  // namespace keel

// Throws keel::Error with the streamed pieces when cond is false.
#define KEEL_ENFORCE(cond, ...)                                    \
  do {                                                             \
    if (!(cond)) throw ::keel::Error(::keel::StrCat(__VA_ARGS__)); \
  } while (0)

#define KEEL_THROW(...) throw ::keel::Error(::keel::StrCat(__VA_ARGS__))
