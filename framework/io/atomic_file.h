// Atomic files: every write goes to a temp file in the same directory, is fsync'ed and renamed
// into place, so that a reader sees the old file or the new one, never half of one
// (atomic_file.cc says how). Failures are keel::Errors naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel {

// Writes `bytes` to `path` atomically (unnamed temp file, fsync, link, rename, fsync of the
// directory); removes the temps of `path` that dead writers on this host left. A file size limit
// (ulimit -f) or a full disk is a keel::Error naming the file, never a SIGXFSZ.
void WriteFileAtomic(const std::string& path, const std::string& bytes);
// Reads the whole file, at most `max_bytes` of it (0: no limit but the file's size), and at most
// 64 MiB of anything but a regular file (a device or a pipe, which has no size); a file that
// holds more is a keel::Error naming it and the limit, read no further.
std::string ReadFile(const std::string& path, size_t max_bytes = 0);
// Makes SIGXFSZ ignored if it has its default action, so that a write past the file size limit
// (ulimit -f) fails with EFBIG instead of killing the process; checked on every write (the
// program may have reset it since).
void IgnoreSigxfsz();
// " (the file size limit, ulimit -f, is N bytes)", or "" without a limit: for EFBIG messages.
std::string FileSizeLimitText();
// fsync of directory `dir`; `what` names the file whose entry it makes durable in errors.
void SyncDirectory(const std::string& dir, const std::string& what);
// ".<base>.tmp.<random>.<pid>@<host>": a temp name beside `base` that says who wrote it.
std::string TempNameFor(const std::string& base);
// Whether `name` starts with `prefix` (".<base>.tmp.") and was made by a dead process of this host.
bool IsStaleTempOf(const std::string& name, const std::string& prefix);
// Removes the entries of `dir` (files or directories) that IsStaleTempOf(prefix); returns how many.
int RemoveStaleTemps(const std::string& dir, const std::string& prefix);
// Before training: creates `dir`, writes and removes a probe file there, and checks that a file
// of `bytes` bytes fits the file size limit (warns when the disk has less free space). A
// keel::Error names `what` (the flag, e.g. "--save_dir") and the reason.
void CheckCanWrite(const std::string& dir, uint64_t bytes, const std::string& what);

}  // namespace keel
