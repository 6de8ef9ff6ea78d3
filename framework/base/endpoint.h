// Endpoints: "host:port" as the launcher's flags, the role maker's environment (Paddle's
// PADDLE_TRAINER_ENDPOINTS, torchrun's MASTER_ADDR/MASTER_PORT) and the rendezvous store spell
// them, checked the same way everywhere.
#pragma once

#include <string>

namespace keel {

struct HostPort {
  std::string host;
  int port = 0;
};

// A keel::Error "<what>: '<host>' is not a host name or address" unless `host` is a non-empty
// name or address without blanks, ',' or '/'; an IPv6 address must be in brackets ("[::1]"), so
// that the last ':' of an endpoint separates the port.
void CheckHost(const std::string& what, const std::string& host);

// A decimal port in 1..65535 (no sign, nothing after it); a keel::Error naming `what` otherwise.
int ParsePort(const std::string& what, const std::string& value);

// "host:port" -> {host, port}, both checked as above; errors name `what` and the endpoint
// (e.g. what = "PADDLE_CURRENT_ENDPOINT": "PADDLE_CURRENT_ENDPOINT='h' is not host:port").
HostPort ParseEndpoint(const std::string& what, const std::string& endpoint);

}  // namespace keel
