#include "framework/data/gzip.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>

#include "framework/error.h"

namespace keel {
namespace {

// zlib counts in uInt; feed and drain at most this much per call.
constexpr size_t kZChunk = size_t{1} << 30;

struct InflateStream {
  z_stream zs{};
  ~InflateStream() { inflateEnd(&zs); }
};

struct DeflateStream {
  z_stream zs{};
  ~DeflateStream() { deflateEnd(&zs); }
};

}  // namespace

bool IsGzip(const std::string& bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KEEL_ENFORCE(in.is_open(), "cannot open ", path, ": ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  std::streamoff n = in.tellg();
  KEEL_ENFORCE(n >= 0, "cannot read ", path, ": not a seekable file");
  in.seekg(0, std::ios::beg);
  std::string bytes(static_cast<size_t>(n), '\0');
  in.read(bytes.data(), n);
  KEEL_ENFORCE(in.gcount() == n, "cannot read ", path, ": got ", in.gcount(), " of ", n, " bytes");
  return bytes;
}

std::string GunzipBytes(const std::string& gz, const std::string& what) {
  InflateStream s;
  z_stream& zs = s.zs;
  // 16 + MAX_WBITS: a gzip wrapper only; zlib then checks the trailer's CRC-32 and length.
  KEEL_ENFORCE(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, what, ": cannot start gzip decoding");
  const auto* in = reinterpret_cast<const Bytef*>(gz.data());
  size_t in_pos = 0;  // bytes of `gz` handed to zlib so far
  std::string out(
      std::min<uint64_t>(std::max<size_t>(gz.size() * 4, 1 << 16), kMaxDecompressedBytes + 1),
      '\0');
  size_t produced = 0;
  for (;;) {
    if (zs.avail_in == 0 && in_pos < gz.size()) {
      zs.next_in = const_cast<Bytef*>(in + in_pos);
      zs.avail_in = static_cast<uInt>(std::min(kZChunk, gz.size() - in_pos));
      in_pos += zs.avail_in;
    }
    if (produced == out.size()) {
      KEEL_ENFORCE(produced <= kMaxDecompressedBytes, what, ": decompresses to more than ",
                   kMaxDecompressedBytes, " bytes");
      out.resize(std::min<uint64_t>(out.size() * 2, kMaxDecompressedBytes + 1));
    }
    const size_t room = std::min(kZChunk, out.size() - produced);
    zs.next_out = reinterpret_cast<Bytef*>(&out[produced]);
    zs.avail_out = static_cast<uInt>(room);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    produced += room - zs.avail_out;
    if (rc == Z_STREAM_END) {
      const size_t consumed = in_pos - zs.avail_in;
      if (consumed == gz.size()) break;
      // Another member may follow (as `cat a.gz b.gz` makes); anything else is garbage.
      KEEL_ENFORCE(IsGzip(gz.substr(consumed, 2)), what, ": ", gz.size() - consumed,
                   " bytes of trailing data after the gzip stream at offset ", consumed);
      KEEL_ENFORCE(inflateReset(&zs) == Z_OK, what, ": cannot restart gzip decoding");
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_out == 0) continue;  // output full: the loop grows it
    // No progress with room to write and all input given: the stream ends early.
    KEEL_ENFORCE(rc != Z_BUF_ERROR, what, ": truncated gzip stream (ends after ", gz.size(),
                 " compressed bytes, ", produced, " decompressed)");
    KEEL_THROW(what, ": corrupt gzip stream at compressed byte ", in_pos - zs.avail_in, ": ",
               zs.msg != nullptr ? zs.msg : "zlib error " + std::to_string(rc));
  }
  out.resize(produced);
  return out;
}

std::string ReadMaybeGzippedFile(const std::string& path) {
  std::string bytes = ReadFileBytes(path);
  return IsGzip(bytes) ? GunzipBytes(bytes, path) : bytes;
}

std::string GzipBytes(const std::string& bytes) {
  DeflateStream s;
  z_stream& zs = s.zs;
  KEEL_ENFORCE(deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8,
                            Z_DEFAULT_STRATEGY) == Z_OK,
               "gzip: cannot start compression");
  std::string out;
  size_t in_pos = 0, produced = 0;
  for (;;) {
    if (zs.avail_in == 0 && in_pos < bytes.size()) {
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data() + in_pos));
      zs.avail_in = static_cast<uInt>(std::min(kZChunk, bytes.size() - in_pos));
      in_pos += zs.avail_in;
    }
    if (out.size() - produced < (1 << 16)) out.resize(std::max<size_t>(out.size() * 2, 1 << 17));
    const size_t room = std::min(kZChunk, out.size() - produced);
    zs.next_out = reinterpret_cast<Bytef*>(&out[produced]);
    zs.avail_out = static_cast<uInt>(room);
    const int flush = in_pos == bytes.size() ? Z_FINISH : Z_NO_FLUSH;
    const int rc = deflate(&zs, flush);
    produced += room - zs.avail_out;
    if (rc == Z_STREAM_END) break;
    KEEL_ENFORCE(rc == Z_OK || rc == Z_BUF_ERROR, "gzip: compression failed (zlib error ", rc, ")");
  }
  out.resize(produced);
  return out;
}

}  // namespace keel
