// Where received bytes land (internal): a 64-byte aligned buffer per
// entry (lib/runtime/pools.hpp), a reserved address range per assembled
// blob, and positional file writes for the file sink.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "blobpipe/errors.hpp"
#include "lib/runtime/pools.hpp"

namespace blobpipe::detail {

/// Address space for one blob under assembly. Pages are committed only
/// when bytes land (MAP_NORESERVE), and untouched pages read as zero, so
/// the pads between entries are zero without being written: the blob is
/// byte-identical to write(plan). Entries land at their final offsets, and
/// the mapping never moves, so views into it stay valid.
class reserved_region {
 public:
  /// Errors: too_large (the mapping failed; the message names errno).
  static result<std::shared_ptr<reserved_region>> make(std::uint64_t nbytes);
  reserved_region(std::byte* p, std::size_t n) noexcept : p_(p), n_(n) {}
  reserved_region(const reserved_region&) = delete;
  reserved_region& operator=(const reserved_region&) = delete;
  ~reserved_region();

  std::byte* data() const noexcept { return p_; }
  std::size_t size() const noexcept { return n_; }

 private:
  std::byte* p_;
  std::size_t n_;
};

/// Writes all of `bytes` at `off` of `fd` (pwrite, retried on EINTR and
/// short writes). Errors: io (the message names errno: a full disk, a
/// descriptor not open for writing).
[[nodiscard]] result<void> write_at(int fd, std::uint64_t off, std::span<const std::byte> bytes);

/// Writes `n` (< 64) zero bytes at `off`.
[[nodiscard]] result<void> write_zeros_at(int fd, std::uint64_t off, std::uint64_t n);

}  // namespace blobpipe::detail
