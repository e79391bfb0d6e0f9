// libFuzzer entry point: Entry::from_meta (the per-entry msgpack map), then
// validate_entry and view_entry over a buffer of the claimed length when
// that length is small. Parsing must stay within its memory budget.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "blobpipe/format/index.hpp"
#include "fuzz/alloc_budget.hpp"

/// The meta parser's stated worst case (docs/reliability.md "Fuzzing").
constexpr blobpipe::fuzz::budget meta_budget{.per_input_byte = 32, .constant_bytes = 64 << 10};

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto e = [&] {
    blobpipe::fuzz::alloc_budget b("Entry::from_meta", size, meta_budget);
    return blobpipe::Entry::from_meta("k", std::as_bytes(std::span(data, size)));
  }();
  if (!e) return 0;
  // meta() of a parsed entry must parse back to the same entry.
  auto again = blobpipe::Entry::from_meta("k", e->meta());
  if (!again || !(*again == *e)) __builtin_trap();
  if (!blobpipe::validate_entry(*e, e->off + 4096)) return 0;
  if (e->len > 4096) return 0;
  std::vector<std::byte> bytes(e->len);
  auto v = blobpipe::view_entry(*e, bytes);
  if (!v) __builtin_trap();  // validated above: the view must agree
  return 0;
}
