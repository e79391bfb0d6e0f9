// libFuzzer entry point: read_index over arbitrary bytes, then decode and
// materialize every entry it accepts (bazel build --config=fuzz).
#include <cstddef>
#include <cstdint>
#include <span>

#include "blobpipe/format.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto blob = std::as_bytes(std::span(data, size));
  auto idx = blobpipe::read_index(blob);
  if (!idx) return 0;
  for (const auto& e : idx->entries) {
    auto v = blobpipe::decode_entry(blob, e);
    if (!v) __builtin_trap();  // read_index validated it: decode must agree
    if (v->numel() > 0) (void)v->as_double(0);
    (void)blobpipe::materialize(*v);
  }
  return 0;
}
