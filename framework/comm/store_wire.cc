#include "framework/comm/store_wire.h"

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
  if (!ReadAll(fd, len, 4, deadline_ms)) return "connection closed or timed out";
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

std::string HelloPayload(const std::string& token, const StoreIdentity& id) {
  return StrCat(kHello, token, "\n", id.generation, "\n", id.rank, "\n", id.nranks);
}

bool ParseHello(const std::string& s, std::string* token, StoreIdentity* id) {
  const size_t magic = sizeof(kHello) - 1;
  if (s.compare(0, magic, kHello) != 0) return false;
  std::vector<std::string> parts = StrSplit(s.substr(magic), '\n');
  if (parts.size() != 4) return false;
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
  *token = parts[0];
  id->generation = gen;
  id->rank = static_cast<int>(rank);
  id->nranks = static_cast<int>(nranks);
  return true;
}

}  // namespace store_wire
}  // namespace keel
