// Whole-file reads and gzip (RFC 1952) through zlib, for dataset files.
#pragma once

#include <cstdint>
#include <string>

namespace keel {

// Decompressed files larger than this are refused (a corrupt or hostile length cannot make a
// reader allocate without bound).
constexpr uint64_t kMaxDecompressedBytes = uint64_t{4} << 30;

// True when `bytes` starts with the gzip magic 1f 8b.
bool IsGzip(const std::string& bytes);

// The whole file; a keel::Error naming `path` when it cannot be opened or read.
std::string ReadFileBytes(const std::string& path);

// The decompressed contents of a gzip stream (concatenated members are joined, as gunzip does).
// Corrupt data, a CRC or length mismatch, truncation or trailing garbage is a keel::Error that
// names `what` (the file).
std::string GunzipBytes(const std::string& gz, const std::string& what);

// The file's bytes, decompressed when they start with the gzip magic.
std::string ReadMaybeGzippedFile(const std::string& path);

// A gzip stream (one member) of `bytes`, at zlib's default level.
std::string GzipBytes(const std::string& bytes);

}  // namespace keel
