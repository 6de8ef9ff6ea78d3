// Whole reads and writes on a file descriptor: POSIX read(2) and write(2) may do part of the
// work or be interrupted (EINTR), and every caller needs the loop that finishes the job. Each
// helper makes only the one system call in its loop (and poll(2) for ReadAll's timeout), so
// WriteAll may also run in a child between fork and exec.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace keel {

// Writes the `n` bytes at `data` to `fd`, retrying short writes and EINTR. False when a write
// fails, with errno saying why (ENOSPC when write(2) wrote nothing); `*written`, when given, is
// how many bytes landed (a caller may drop a partial record).
bool WriteAll(int fd, const void* data, size_t n, size_t* written = nullptr);

// WriteAll for a socket: send(2) with MSG_NOSIGNAL, so that a peer that has gone is an EPIPE,
// not a SIGPIPE that kills the process.
bool SendAll(int fd, const void* data, size_t n);

// Reads exactly `n` bytes into `buf`. False at end of file, on an error, or when `timeout_ms`
// (-1: none) passes before all have arrived; then `why` (when given) says which: "closed by the
// peer", "timed out after N ms" or the error.
bool ReadAll(int fd, void* buf, size_t n, int64_t timeout_ms = -1, std::string* why = nullptr);

}  // namespace keel
