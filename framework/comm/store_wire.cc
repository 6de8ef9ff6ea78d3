#include "framework/comm/store_wire.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "framework/base/fd_io.h"
#include "framework/base/strings.h"
#include "framework/error.h"

namespace keel {
namespace store_wire {

void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t GetLE(const char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

bool WriteFrame(int fd, const std::string& payload) {
  std::string f;
  f.reserve(4 + payload.size());
  PutU32(&f, static_cast<uint32_t>(payload.size()));
  f += payload;
  return SendAll(fd, f.data(), f.size());
}

std::string ReadFrame(int fd, std::string* out, int64_t deadline_ms, uint32_t cap) {
  char len[4];
  std::string why;
  if (!ReadAll(fd, len, 4, deadline_ms, &why)) return "connection " + why;
  uint32_t n = static_cast<uint32_t>(GetLE(len, 4));
  if (n > cap)
    return "frame of " + std::to_string(n) + " bytes exceeds the cap of " + std::to_string(cap);
  out->clear();
  constexpr size_t kChunk = 1 << 20;
  while (out->size() < n) {
    size_t have = out->size(), take = std::min<size_t>(kChunk, n - have);
    out->resize(have + take);
    if (!ReadAll(fd, &(*out)[have], take, deadline_ms)) return "connection closed mid-frame";
  }
  return "";
}

std::string KeyField(const std::string& key) {
  std::string s;
  PutU32(&s, static_cast<uint32_t>(key.size()));
  return s + key;
}

std::string HelloPayload(const std::string& client_nonce, const StoreIdentity& id) {
  return StrCat(kHello, Hex(client_nonce), "\n", id.generation, "\n", id.rank, "\n", id.nranks);
}

bool ParseHello(const std::string& s, StoreIdentity* id) {
  const size_t magic = sizeof(kHello) - 1;
  if (s.compare(0, magic, kHello) != 0) return false;
  std::vector<std::string> parts = StrSplit(s.substr(magic), '\n');
  if (parts.size() != 4) return false;
  if (parts[0].size() != 2 * kNonceBytes ||
      parts[0].find_first_not_of("0123456789abcdef") != std::string::npos)
    return false;
  auto num = [](const std::string& t, int64_t* v) {
    if (t.empty() || t.size() > 18) return false;
    char* end = nullptr;
    *v = std::strtoll(t.c_str(), &end, 10);
    return end == t.c_str() + t.size();
  };
  int64_t gen, rank, nranks;
  if (!num(parts[1], &gen) || !num(parts[2], &rank) || !num(parts[3], &nranks)) return false;
  if (rank < -1 || nranks < 0 || nranks > (1 << 24) || rank >= std::max<int64_t>(nranks, 1))
    return false;
  id->generation = gen;
  id->rank = static_cast<int>(rank);
  id->nranks = static_cast<int>(nranks);
  return true;
}

std::string RandomBytes(size_t n) {
  std::string out(n, '\0');
  KEEL_ENFORCE(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) == 1,
               "store: no random bytes for a handshake nonce (OpenSSL RAND_bytes failed)");
  return out;
}

std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * bytes.size());
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

std::string Proof(const std::string& token, Prover who, const std::string& hello,
                  const std::string& server_nonce) {
  const std::string message =
      StrCat(who == Prover::kClient ? "keel-store/3 client proof\n" : "keel-store/3 server proof\n",
             hello, "\n", Hex(server_nonce));
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // An empty key (a one-worker job has no token) is a valid HMAC key; OpenSSL wants a non-null
  // pointer for it.
  static const char kEmpty = 0;
  const unsigned char* out =
      HMAC(EVP_sha256(), token.empty() ? &kEmpty : token.data(), static_cast<int>(token.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &len);
  KEEL_ENFORCE(out != nullptr && len == kProofBytes, "store: HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(mac), len);
}

bool SameProof(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace store_wire
}  // namespace keel
