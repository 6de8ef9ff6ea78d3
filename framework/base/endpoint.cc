#include "framework/base/endpoint.h"

#include <cctype>
#include <charconv>

#include "framework/error.h"

namespace keel {

void CheckHost(const std::string& what, const std::string& host) {
  bool ok = !host.empty();
  for (char c : host)
    ok = ok && !std::isspace(static_cast<unsigned char>(c)) && c != ',' && c != '/';
  bool bracketed = host.size() > 2 && host.front() == '[' && host.back() == ']';
  ok = ok && (bracketed || host.find_first_of("[]:") == std::string::npos);
  KEEL_ENFORCE(ok, what, ": '", host, "' is not a host name or address");
}

int ParsePort(const std::string& what, const std::string& value) {
  int port = 0;
  auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), port);
  KEEL_ENFORCE(!value.empty() && ec == std::errc() && p == value.data() + value.size() &&
                   value[0] != '-' && port >= 1 && port <= 65535,
               what, ": port '", value, "' is not in 1..65535");
  return port;
}

HostPort ParseEndpoint(const std::string& what, const std::string& endpoint) {
  size_t colon = endpoint.rfind(':');
  KEEL_ENFORCE(colon != std::string::npos, what, "='", endpoint, "' is not host:port");
  HostPort hp{endpoint.substr(0, colon), 0};
  CheckHost(StrCat(what, "='", endpoint, "'"), hp.host);
  hp.port = ParsePort(StrCat(what, "='", endpoint, "'"), endpoint.substr(colon + 1));
  return hp;
}

}  // namespace keel
