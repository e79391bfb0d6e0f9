#include "lib/pipeline/receive_buffers.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

#include "blobpipe/format/footer.hpp"
#include "blobpipe/format/layout.hpp"

namespace blobpipe::detail {

static_assert(pool_align == ALIGN, "pooled blocks hold entries at the format's alignment");

result<std::shared_ptr<reserved_region>> reserved_region::make(std::uint64_t nbytes) {
  void* p = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return {errc::too_large, "assembly buffer: mmap of " + std::to_string(nbytes) +
                                 " bytes failed: " + std::strerror(errno)};
  return std::make_shared<reserved_region>(static_cast<std::byte*>(p), nbytes);
}

reserved_region::~reserved_region() { ::munmap(p_, n_); }

result<void> write_at(int fd, std::uint64_t off, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(off));
    if (n < 0) {
      if (errno == EINTR) continue;
      return {errc::io, std::string("file sink: pwrite failed: ") + std::strerror(errno)};
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
    off += static_cast<std::uint64_t>(n);
  }
  return {};
}

result<void> write_zeros_at(int fd, std::uint64_t off, std::uint64_t n) {
  static constexpr std::array<std::byte, ALIGN> zeros{};
  return write_at(fd, off, std::span(zeros).first(static_cast<std::size_t>(n)));
}

}  // namespace blobpipe::detail
