// libFuzzer entry point: torch and numpy dtype spellings.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "blobpipe/format/dtype.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  auto t = blobpipe::parse_torch_dtype(s);
  auto n = blobpipe::parse_numpy_dtype(s);
  // A parsed dtype re-parses to itself from its canonical name.
  if (t && !(blobpipe::parse_torch_dtype(t->name).value() == *t)) __builtin_trap();
  if (n && n->itemsize > (std::size_t{1} << 33)) __builtin_trap();
  return 0;
}
