// The rendezvous store's wire format (store.h describes it), shared by the server
// (store_server.cc) and the client (store_client.cc): frames, the hello, request and reply codes.
// Internal to framework/comm.
#pragma once

#include <cstdint>
#include <string>

#include "framework/comm/store.h"

namespace keel {
namespace store_wire {

constexpr char kHello[] = "KEEL-STORE/3\n";
// Random bytes in each nonce, and bytes of a proof (an HMAC-SHA256).
constexpr size_t kNonceBytes = 16;
constexpr size_t kProofBytes = 32;
enum Op : uint8_t {
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kCheck = 4,
  kDel = 5,
  kBarrier = 6,
  kGetAlive = 7
};
enum Status : uint8_t {
  kOk = 0,
  kTimeout = 1,
  kBad = 2,
  kBadToken = 3,
  kBadGeneration = 4,
  kPeerGone = 5,
  kChallenge = 6  // the server's answer to a hello: its nonce follows
};

// Little-endian integers, appended to `s` or read from `p` (`n` bytes).
void PutU32(std::string* s, uint32_t v);
void PutU64(std::string* s, uint64_t v);
uint64_t GetLE(const char* p, int n);

bool WriteFrame(int fd, const std::string& payload);
// Reads one frame of at most `cap` bytes; returns an error description (empty on success). The
// buffer grows with the bytes that arrive, so a length prefix alone allocates nothing.
std::string ReadFrame(int fd, std::string* out, int64_t deadline_ms = -1,
                      uint32_t cap = kMaxFrameBytes);

// A cursor over a request payload that refuses to read past the end.
struct Reader {
  const std::string& s;
  size_t pos = 0;
  bool ok = true;
  uint64_t Int(int n) {
    if (pos + n > s.size()) {
      ok = false;
      return 0;
    }
    uint64_t v = GetLE(s.data() + pos, n);
    pos += n;
    return v;
  }
  std::string Bytes(size_t n) {
    if (pos + n > s.size()) {
      ok = false;
      return "";
    }
    std::string v = s.substr(pos, n);
    pos += n;
    return v;
  }
  std::string Key() { return Bytes(Int(4)); }
};

// A request's key: its u32 length, then the key.
std::string KeyField(const std::string& key);

// "KEEL-STORE/3\n<client nonce, hex>\n<generation>\n<rank>\n<nranks>": no secret in it.
std::string HelloPayload(const std::string& client_nonce, const StoreIdentity& id);
// Parses a hello; false when malformed.
bool ParseHello(const std::string& s, StoreIdentity* id);

// `n` bytes from the system's cryptographic random source (OpenSSL's RAND_bytes); a keel::Error
// when it fails.
std::string RandomBytes(size_t n);
std::string Hex(const std::string& bytes);

// Who proves: the two proofs of one handshake differ, so neither can stand for the other.
enum class Prover { kClient, kServer };
// HMAC-SHA256 keyed with the job token over the prover's role, the hello and the server's nonce:
// what each side sends to show it knows the token without sending it. The client's nonce (in the
// hello) and the server's make every handshake's proofs fresh, so a recorded one is worth nothing.
std::string Proof(const std::string& token, Prover who, const std::string& hello,
                  const std::string& server_nonce);
// Compares two proofs in time that does not depend on where they differ.
bool SameProof(const std::string& a, const std::string& b);

}  // namespace store_wire
}  // namespace keel
