// safetensors encode/decode: [u64 LE header length N][N bytes JSON header][data buffer].
//
// The decoder trusts nothing: the header length is checked against the file size (and capped),
// the JSON is parsed strictly by a small depth-limited parser, and every dtype, shape and offset
// is checked before a byte of data is copied: the tensors must tile the data buffer exactly (no
// gap, no overlap, nothing after the last), as the reference library requires. The writer puts a
// CRC-32 of the data buffer in __metadata__ ("keel.data_crc32") and one of the rest of the header
// ("keel.header_crc32": every other metadata entry and every tensor's name, dtype, shape and
// offsets, so an edited training step or two exchanged offsets are caught); the reader verifies
// them when present. A file that carries keel's metadata (a "keel.*" entry or format "keel") must
// carry the data checksum, and from keel.version 2 the header checksum too, unless
// --safetensors_allow_unverified asks to load it anyway: deleting a checksum does not disable
// the check. Files of other writers have none and load without. Every failure is a keel::Error
// starting with `what`.
#include "framework/io/safetensors.h"

#include <gflags/gflags.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "framework/error.h"
#include "framework/io/atomic_file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "keel's safetensors code copies tensor bytes as-is and needs a little-endian host"
#endif

DEFINE_bool(safetensors_allow_unverified, false,
            "Load a keel safetensors file (checkpoint, parameters) whose checksums are missing, "
            "with a warning; false: such a file is an error (a deleted checksum is tampering or "
            "damage as surely as a wrong one).");

namespace keel {
namespace {

// Headers larger than this are refused before any allocation (the Rust reader caps at 100 MB too).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Nesting beyond this is never a valid header; the cap keeps the recursive parser's stack bounded.
constexpr int kMaxJsonDepth = 32;
// The __metadata__ key of the data buffer's CRC-32 (zlib's), 8 lowercase hex digits.
const char kChecksumKey[] = "keel.data_crc32";
// The __metadata__ key of the CRC-32 of HeaderDigestText: the rest of the header.
const char kHeaderChecksumKey[] = "keel.header_crc32";

uint32_t Crc32(const char* p, uint64_t n) {
  return static_cast<uint32_t>(crc32_z(crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(p), n));
}

std::string Hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

// ---------------------------------------------------------------- dtype names

struct DTypeCode {
  DType dtype;
  const char* code;
};
constexpr DTypeCode kDTypeCodes[] = {
    {DType::kFloat32, "F32"},   {DType::kFloat64, "F64"}, {DType::kInt32, "I32"},
    {DType::kInt64, "I64"},     {DType::kBool, "BOOL"},   {DType::kFloat16, "F16"},
    {DType::kBFloat16, "BF16"}, {DType::kUInt8, "U8"},    {DType::kInt8, "I8"},
};

const char* SafetensorsCode(DType t) {
  for (const auto& c : kDTypeCodes)
    if (c.dtype == t) return c.code;
  KEEL_THROW("dtype ", DTypeName(t), " has no safetensors code");
}

bool DTypeFromCode(const std::string& code, DType* out) {
  for (const auto& c : kDTypeCodes)
    if (code == c.code) {
      *out = c.dtype;
      return true;
    }
  return false;
}

// ---------------------------------------------------------------- UTF-8

// Length of the well-formed UTF-8 sequence at p (no overlongs, surrogates or code points past
// U+10FFFF), or 0 when there is none.
size_t Utf8SequenceLength(const char* p, const char* end) {
  unsigned char c = static_cast<unsigned char>(*p);
  if (c < 0x80) return 1;
  if (c < 0xC2 || c > 0xF4) return 0;
  const int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
  if (end - p <= extra) return 0;
  uint32_t cp = c & (0x3F >> extra);
  for (int i = 1; i <= extra; ++i) {
    unsigned char cc = static_cast<unsigned char>(p[i]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
  }
  const uint32_t min = extra == 1 ? 0x80 : extra == 2 ? 0x800 : 0x10000;
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return static_cast<size_t>(extra) + 1;
}

bool IsValidUtf8(const std::string& s) {
  const char* end = s.data() + s.size();
  for (const char* p = s.data(); p < end;) {
    size_t n = Utf8SequenceLength(p, end);
    if (n == 0) return false;
    p += n;
  }
  return true;
}

// ---------------------------------------------------------------- JSON writer

// '"' and '\\' are escaped, control characters as \u00XX; UTF-8 passes through unchanged.
void AppendJsonString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      *out += buf;
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

// ---------------------------------------------------------------- JSON parser

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  std::string text;  // string value, or a number's literal text
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;  // in file order, keys unique

  const char* KindName() const {
    static constexpr const char* kNames[] = {"null",     "a boolean", "a number",
                                             "a string", "an array",  "an object"};
    return kNames[static_cast<int>(kind)];
  }
};

// Strict RFC 8259 parser over [begin, end). Errors name `what` and the byte offset in the header.
class JsonParser {
 public:
  JsonParser(const char* begin, const char* end, const std::string& what)
      : begin_(begin), p_(begin), end_(end), what_(what) {}

  Json ParseDocument() {
    SkipSpace();
    Json v = ParseValue(0);
    SkipSpace();  // the writer pads the header with spaces
    if (p_ != end_) Fail("unexpected trailing characters after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void Fail(const std::string& msg) const {
    KEEL_THROW(what_, ": bad safetensors header: ", msg, " (at header byte ", p_ - begin_, ")");
  }

  void SkipSpace() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  bool Consume(char c) {
    if (p_ < end_ && *p_ == c) {
      ++p_;
      return true;
    }
    return false;
  }
  void Expect(char c) {
    if (!Consume(c)) Fail(StrCat("expected '", c, "'"));
  }
  void ExpectWord(const char* w) {
    size_t n = std::strlen(w);
    if (static_cast<size_t>(end_ - p_) < n || std::memcmp(p_, w, n) != 0) Fail("invalid literal");
    p_ += n;
  }

  Json ParseValue(int depth) {
    if (depth > kMaxJsonDepth) Fail("nesting deeper than " + std::to_string(kMaxJsonDepth));
    if (p_ >= end_) Fail("unexpected end of header");
    Json v;
    switch (*p_) {
      case '{':
        ParseObject(&v, depth);
        break;
      case '[':
        ParseArray(&v, depth);
        break;
      case '"':
        v.kind = Json::Kind::kString;
        v.text = ParseString();
        break;
      case 't':
        ExpectWord("true");
        v.kind = Json::Kind::kBool;
        v.boolean = true;
        break;
      case 'f':
        ExpectWord("false");
        v.kind = Json::Kind::kBool;
        break;
      case 'n':
        ExpectWord("null");
        break;
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) {
          v.kind = Json::Kind::kNumber;
          v.text = ParseNumber();
        } else {
          Fail(StrCat("unexpected character '", PrintableChar(*p_), "'"));
        }
    }
    return v;
  }

  static std::string PrintableChar(char c) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return std::string(1, c);
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02x", u);
    return buf;
  }

  void ParseObject(Json* v, int depth) {
    v->kind = Json::Kind::kObject;
    Expect('{');
    SkipSpace();
    if (Consume('}')) return;
    std::set<std::string> keys;  // a set, not a scan of members: headers may hold many tensors
    for (;;) {
      SkipSpace();
      if (p_ >= end_ || *p_ != '"') Fail("expected a string key");
      std::string key = ParseString();
      if (!keys.insert(key).second) Fail("duplicate key \"" + key + "\"");
      SkipSpace();
      Expect(':');
      SkipSpace();
      v->members.emplace_back(std::move(key), ParseValue(depth + 1));
      SkipSpace();
      if (Consume('}')) return;
      Expect(',');
    }
  }

  void ParseArray(Json* v, int depth) {
    v->kind = Json::Kind::kArray;
    Expect('[');
    SkipSpace();
    if (Consume(']')) return;
    for (;;) {
      SkipSpace();
      v->items.push_back(ParseValue(depth + 1));
      SkipSpace();
      if (Consume(']')) return;
      Expect(',');
    }
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, returned as literal text.
  std::string ParseNumber() {
    const char* start = p_;
    auto digits = [&] {
      const char* d = p_;
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
      if (p_ == d) Fail("malformed number");
    };
    Consume('-');
    if (p_ < end_ && *p_ == '0') {
      ++p_;
    } else {
      digits();
    }
    if (Consume('.')) digits();
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (!Consume('+')) Consume('-');
      digits();
    }
    return std::string(start, p_);
  }

  unsigned Hex4() {
    if (end_ - p_ < 4) Fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i, ++p_) {
      char c = *p_;
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        Fail("bad hex digit in \\u escape");
      }
    }
    return v;
  }

  static void AppendUtf8(std::string* s, uint32_t cp) {
    if (cp < 0x80) {
      s->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      s->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      s->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      s->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      s->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  std::string ParseString() {
    Expect('"');
    std::string s;
    for (;;) {
      if (p_ >= end_) Fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return s;
      }
      if (c < 0x20) Fail("control character in string");
      if (c >= 0x80) {
        size_t n = Utf8SequenceLength(p_, end_);
        if (n == 0) Fail("invalid UTF-8 in string");
        s.append(p_, n);
        p_ += n;
        continue;
      }
      ++p_;
      if (c != '\\') {
        s.push_back(static_cast<char>(c));
        continue;
      }
      if (p_ >= end_) Fail("unterminated escape");
      const char e = *p_++;
      static constexpr char kEscaped[] = "\"\\/bfnrt", kUnescaped[] = "\"\\/\b\f\n\r\t";
      if (const char* hit = e ? std::strchr(kEscaped, e) : nullptr) {
        s.push_back(kUnescaped[hit - kEscaped]);
        continue;
      }
      if (e != 'u') Fail(StrCat("invalid escape '\\", PrintableChar(e), "'"));
      uint32_t cp = Hex4();
      if (cp >= 0xDC00 && cp <= 0xDFFF) Fail("unpaired low surrogate in \\u escape");
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') Fail("unpaired high surrogate");
        p_ += 2;
        uint32_t lo = Hex4();
        if (lo < 0xDC00 || lo > 0xDFFF) Fail("unpaired high surrogate");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      AppendUtf8(&s, cp);
    }
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  const std::string& what_;
};

// ---------------------------------------------------------------- header interpretation

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// A JSON number that must be a non-negative integer fitting in int64.
uint64_t ToUint(const Json& v, const std::string& what, const std::string& ctx) {
  KEEL_ENFORCE(v.kind == Json::Kind::kNumber, what, ": bad safetensors header: ", ctx,
               " must be a non-negative integer, got ", v.KindName());
  const std::string& t = v.text;
  bool digits_only =
      !t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  KEEL_ENFORCE(digits_only, what, ": bad safetensors header: ", ctx,
               " must be a non-negative integer, got ", t);
  uint64_t r = 0;
  for (char c : t) {
    KEEL_ENFORCE(r <= (static_cast<uint64_t>(INT64_MAX) - (c - '0')) / 10, what,
                 ": bad safetensors header: ", ctx, " ", t, " is too large");
    r = r * 10 + static_cast<uint64_t>(c - '0');
  }
  return r;
}

Entry ParseEntry(const std::string& name, const Json& v, const std::string& what) {
  const std::string ctx = "tensor \"" + name + "\"";
  KEEL_ENFORCE(v.kind == Json::Kind::kObject, what, ": bad safetensors header: ", ctx,
               " must be an object, got ", v.KindName());
  const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const auto& m : v.members) {
    if (m.first == "dtype") {
      dtype = &m.second;
    } else if (m.first == "shape") {
      shape = &m.second;
    } else if (m.first == "data_offsets") {
      offsets = &m.second;
    } else {
      KEEL_THROW(what, ": bad safetensors header: ", ctx, " has unknown field \"", m.first, "\"");
    }
  }
  KEEL_ENFORCE(dtype && shape && offsets, what, ": bad safetensors header: ", ctx,
               " needs \"dtype\", \"shape\" and \"data_offsets\"");

  Entry e;
  e.name = name;
  KEEL_ENFORCE(dtype->kind == Json::Kind::kString, what, ": bad safetensors header: ", ctx,
               " dtype must be a string, got ", dtype->KindName());
  KEEL_ENFORCE(DTypeFromCode(dtype->text, &e.dtype), what, ": ", ctx, " has dtype \"", dtype->text,
               "\", which keel does not support (F32 F64 I32 I64 BOOL F16 BF16 U8 I8)");

  KEEL_ENFORCE(shape->kind == Json::Kind::kArray, what, ": bad safetensors header: ", ctx,
               " shape must be an array, got ", shape->KindName());
  KEEL_ENFORCE(shape->items.size() <= static_cast<size_t>(DDim::kMaxRank), what, ": ", ctx,
               " has rank ", shape->items.size(), ", keel supports at most ", DDim::kMaxRank);
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& d : shape->items) {
    uint64_t dim = ToUint(d, what, ctx + " shape dim");
    e.shape.push_back(static_cast<int64_t>(dim));
    overflow |= __builtin_mul_overflow(numel, dim, &numel);
  }
  uint64_t nbytes = 0;
  overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(SizeOf(e.dtype)), &nbytes);

  KEEL_ENFORCE(offsets->kind == Json::Kind::kArray && offsets->items.size() == 2, what,
               ": bad safetensors header: ", ctx, " data_offsets must be [begin, end]");
  e.begin = ToUint(offsets->items[0], what, ctx + " data_offsets[0]");
  e.end = ToUint(offsets->items[1], what, ctx + " data_offsets[1]");
  KEEL_ENFORCE(e.begin <= e.end, what, ": ", ctx, " has data_offsets [", e.begin, ", ", e.end,
               "] with begin > end");
  KEEL_ENFORCE(!overflow && e.end - e.begin == nbytes, what, ": ", ctx, " of ", dtype->text,
               DDim(e.shape).str(), " needs ",
               overflow ? std::string("more than 2^64") : std::to_string(nbytes),
               " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin);
  return e;
}

uint64_t ReadU64LE(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

}  // namespace

namespace {

// What the header checksum covers, canonically: the metadata entries but the two checksums, in
// key order, then each tensor's name, dtype, shape and offsets, in name order.
struct TensorRecord {
  std::string name, code;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};
std::string HeaderDigestText(const std::map<std::string, std::string>& meta,
                             std::vector<TensorRecord> tensors) {
  std::string s;
  for (const auto& [k, v] : meta) {
    if (k == kChecksumKey || k == kHeaderChecksumKey) continue;
    s += std::to_string(k.size()) + ":" + k + "=" + std::to_string(v.size()) + ":" + v + "\n";
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const TensorRecord& a, const TensorRecord& b) { return a.name < b.name; });
  for (const TensorRecord& t : tensors) {
    s += std::to_string(t.name.size()) + ":" + t.name + " " + t.code + " [";
    for (int64_t d : t.shape) s += std::to_string(d) + ",";
    s += "] " + std::to_string(t.begin) + " " + std::to_string(t.end) + "\n";
  }
  return s;
}

}  // namespace

std::string EncodeSafetensors(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // Largest element size first, then by name: each tensor then starts aligned to its element size
  // (the data buffer itself starts 8-aligned), as the reference writer does.
  std::vector<const std::pair<std::string, Tensor>*> order;
  for (const auto& nt : tensors) {
    const Tensor& t = nt.second;
    KEEL_ENFORCE(t.initialized(), "safetensors: tensor '", nt.first, "' is not initialized");
    KEEL_ENFORCE(t.place().is_cpu(), "safetensors: tensor '", nt.first, "' is on ", t.place().str(),
                 "; copy it to CPU before saving");
    KEEL_ENFORCE(t.dims().known(), "safetensors: tensor '", nt.first, "' has unknown shape ",
                 t.dims().str());
    KEEL_ENFORCE(nt.first != "__metadata__", "safetensors: '__metadata__' is reserved");
    KEEL_ENFORCE(IsValidUtf8(nt.first), "safetensors: tensor name '", nt.first,
                 "' is not valid UTF-8");
    order.push_back(&nt);
  }
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
    size_t sa = SizeOf(a->second.dtype()), sb = SizeOf(b->second.dtype());
    return sa != sb ? sa > sb : a->first < b->first;
  });
  for (size_t i = 1; i < order.size(); ++i)
    KEEL_ENFORCE(order[i - 1]->first != order[i]->first, "safetensors: tensor '", order[i]->first,
                 "' given twice");

  for (const auto& kv : metadata)
    KEEL_ENFORCE(IsValidUtf8(kv.first) && IsValidUtf8(kv.second), "safetensors: metadata entry '",
                 kv.first, "' is not valid UTF-8");
  // The checksum of the data buffer in file order (it replaces any the caller passed on).
  uLong crc = crc32(0L, Z_NULL, 0);
  for (const auto* nt : order)
    crc = crc32_z(crc, static_cast<const Bytef*>(nt->second.raw_data()), nt->second.nbytes());
  std::map<std::string, std::string> meta = metadata;
  meta[kChecksumKey] = Hex32(static_cast<uint32_t>(crc));
  // Each tensor's entry in file order: what the header lists and its checksum covers.
  std::vector<TensorRecord> records;
  uint64_t offset = 0;
  for (const auto* nt : order) {
    const Tensor& t = nt->second;
    std::vector<int64_t> shape;
    for (int d = 0; d < t.dims().size(); ++d) shape.push_back(t.dims()[d]);
    records.push_back({nt->first, SafetensorsCode(t.dtype()), shape, offset, offset + t.nbytes()});
    offset += t.nbytes();
  }
  const std::string digest = HeaderDigestText(meta, records);
  meta[kHeaderChecksumKey] = Hex32(Crc32(digest.data(), digest.size()));
  std::string header = "{";
  {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& kv : meta) {
      if (!first) header += ",";
      first = false;
      AppendJsonString(&header, kv.first);
      header += ":";
      AppendJsonString(&header, kv.second);
    }
    header += "}";
  }
  for (const TensorRecord& r : records) {
    header += ",";
    AppendJsonString(&header, r.name);
    header += ":{\"dtype\":\"" + r.code + "\",\"shape\":[";
    for (size_t d = 0; d < r.shape.size(); ++d) {
      if (d) header += ",";
      header += std::to_string(r.shape[d]);
    }
    header += "],\"data_offsets\":[" + std::to_string(r.begin) + "," + std::to_string(r.end) + "]}";
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // data buffer starts 8-aligned

  std::string out;
  out.reserve(8 + header.size() + offset);
  uint64_t n = header.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += header;
  for (const auto* nt : order)
    out.append(static_cast<const char*>(nt->second.raw_data()), nt->second.nbytes());
  return out;
}

NamedTensors DecodeSafetensors(const std::string& bytes, const std::string& what,
                               std::map<std::string, std::string>* metadata) {
  KEEL_ENFORCE(bytes.size() >= 8, what, ": not a safetensors file (", bytes.size(),
               " bytes, shorter than the 8-byte header length)");
  const uint64_t n = ReadU64LE(bytes.data());
  KEEL_ENFORCE(n <= kMaxHeaderBytes, what, ": safetensors header length ", n,
               " exceeds the limit of ", kMaxHeaderBytes,
               " bytes (corrupt or not a safetensors file)");
  KEEL_ENFORCE(n <= bytes.size() - 8, what, ": safetensors header length ", n,
               " exceeds the file size of ", bytes.size(), " bytes (truncated file?)");
  KEEL_ENFORCE(n >= 2 && bytes[8] == '{', what,
               ": safetensors header does not start with '{' (not a safetensors file)");
  const char* header = bytes.data() + 8;
  const char* data = header + n;
  const uint64_t data_size = bytes.size() - 8 - n;

  Json doc = JsonParser(header, data, what).ParseDocument();
  KEEL_ENFORCE(doc.kind == Json::Kind::kObject, what,
               ": bad safetensors header: top level must be an object");

  std::map<std::string, std::string> meta;
  std::vector<Entry> entries;
  for (const auto& m : doc.members) {
    if (m.first == "__metadata__") {
      KEEL_ENFORCE(m.second.kind == Json::Kind::kObject, what,
                   ": bad safetensors header: __metadata__ must be an object of strings");
      for (const auto& kv : m.second.members) {
        KEEL_ENFORCE(kv.second.kind == Json::Kind::kString, what,
                     ": bad safetensors header: __metadata__[\"", kv.first,
                     "\"] must be a string, got ", kv.second.KindName());
        meta[kv.first] = kv.second.text;
      }
      continue;
    }
    entries.push_back(ParseEntry(m.first, m.second, what));
  }

  // The tensors tile the buffer: from 0, each starting where the previous ends, up to its end.
  std::vector<const Entry*> by_offset;
  for (const Entry& e : entries) {
    KEEL_ENFORCE(e.end <= data_size, what, ": tensor \"", e.name, "\" data_offsets [", e.begin,
                 ", ", e.end, "] exceed the data buffer of ", data_size,
                 " bytes (truncated file?)");
    by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;  // the buffer is tiled up to here
  for (size_t i = 0; i < by_offset.size(); ++i) {
    const Entry* b = by_offset[i];
    if (i > 0) {
      const Entry* a = by_offset[i - 1];
      KEEL_ENFORCE(a->end <= b->begin, what, ": tensors \"", a->name, "\" [", a->begin, ", ",
                   a->end, ") and \"", b->name, "\" [", b->begin, ", ", b->end,
                   ") overlap in the data buffer");
    }
    KEEL_ENFORCE(b->begin == covered, what, ": the data buffer has a gap of ", b->begin - covered,
                 " bytes at offset ", covered, " before tensor \"", b->name,
                 "\": tensor offsets must tile the data buffer from 0 (a corrupt or hand-edited ",
                 "file; its data would be read shifted)");
    covered = b->end;
  }
  KEEL_ENFORCE(covered == data_size, what, ": the data buffer holds ", data_size - covered,
               " bytes after the last tensor (ending at offset ", covered,
               "): tensor offsets must tile the data buffer exactly");
  // keel's own files must carry their checksums (see the top of this file).
  bool keel_file = meta.count("format") && meta.at("format") == "keel";
  for (const auto& kv : meta) keel_file = keel_file || kv.first.rfind("keel.", 0) == 0;
  const bool header_required = meta.count("keel.version") && meta.at("keel.version") != "1";
  for (const char* key : {kChecksumKey, kHeaderChecksumKey}) {
    if (!keel_file || meta.count(key) || (key == kHeaderChecksumKey && !header_required)) continue;
    KEEL_ENFORCE(FLAGS_safetensors_allow_unverified, what, ": a keel file without its \"", key,
                 "\" checksum (damaged or edited); --safetensors_allow_unverified loads it anyway");
    std::fprintf(stderr,
                 "warning: %s: no \"%s\" checksum; loaded unverified "
                 "(--safetensors_allow_unverified)\n",
                 what.c_str(), key);
  }
  if (meta.count(kHeaderChecksumKey)) {
    const std::string& want = meta[kHeaderChecksumKey];
    std::vector<TensorRecord> records;
    for (const Entry& e : entries)
      records.push_back({e.name, SafetensorsCode(e.dtype), e.shape, e.begin, e.end});
    const std::string digest = HeaderDigestText(meta, records);
    KEEL_ENFORCE(want == Hex32(Crc32(digest.data(), digest.size())), what,
                 ": the header (metadata and tensor table) does not match its checksum (",
                 kHeaderChecksumKey, " ", want, "): the file was edited or is corrupt");
    meta.erase(kHeaderChecksumKey);
  }
  if (meta.count(kChecksumKey)) {
    const std::string& want = meta[kChecksumKey];
    const std::string got = Hex32(Crc32(data, data_size));
    KEEL_ENFORCE(
        want.size() == 8 && want.find_first_not_of("0123456789abcdef") == std::string::npos, what,
        ": __metadata__[\"", kChecksumKey, "\"] is \"", want, "\", not 8 lowercase hex digits");
    KEEL_ENFORCE(want == got, what, ": the tensor data does not match its checksum (", kChecksumKey,
                 " ", want, " in the header, ", got, " computed): the file is corrupt");
    meta.erase(kChecksumKey);  // verified; callers see their own metadata, as they wrote it
  }

  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.name < b.name; });
  NamedTensors out;
  out.reserve(entries.size());
  for (const Entry& e : entries) {
    const char* src = data + e.begin;
    const size_t size = static_cast<size_t>(e.end - e.begin);
    // A bool byte other than 0/1 is undefined behaviour once read as bool.
    if (e.dtype == DType::kBool) {
      for (size_t i = 0; i < size; ++i)
        KEEL_ENFORCE(static_cast<unsigned char>(src[i]) <= 1, what, ": BOOL tensor \"", e.name,
                     "\" holds byte value ", static_cast<int>(static_cast<unsigned char>(src[i])),
                     " at element ", i, " (must be 0 or 1)");
    }
    Tensor t(e.dtype, DDim(e.shape));
    if (size > 0) std::memcpy(t.raw_data(), src, size);
    out.emplace_back(e.name, std::move(t));
  }
  if (metadata) *metadata = std::move(meta);
  return out;
}

void SaveSafetensors(const std::string& path, const NamedTensors& tensors,
                     const std::map<std::string, std::string>& metadata) {
  std::string bytes;
  try {
    bytes = EncodeSafetensors(tensors, metadata);
  } catch (const Error& e) {
    KEEL_THROW(path, ": ", e.what());
  }
  WriteFileAtomic(path, bytes);
}

NamedTensors LoadSafetensors(const std::string& path,
                             std::map<std::string, std::string>* metadata) {
  return DecodeSafetensors(ReadFile(path), path, metadata);
}

}  // namespace keel
