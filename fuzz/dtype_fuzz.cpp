// libFuzzer entry point: torch and numpy dtype spellings, within a memory
// budget.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "blobpipe/format/dtype.hpp"
#include "fuzz/alloc_budget.hpp"

/// The dtype parsers' stated worst case (docs/reliability.md "Fuzzing").
constexpr blobpipe::fuzz::budget dtype_budget{.per_input_byte = 4, .constant_bytes = 4 << 10};

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  blobpipe::fuzz::alloc_budget b("parse_torch_dtype, parse_numpy_dtype", size, dtype_budget);
  auto t = blobpipe::parse_torch_dtype(s);
  auto n = blobpipe::parse_numpy_dtype(s);
  // A parsed dtype re-parses to itself from its canonical name.
  if (t && !(blobpipe::parse_torch_dtype(t->name).value() == *t)) __builtin_trap();
  if (n && n->itemsize > (std::size_t{1} << 33)) __builtin_trap();
  return 0;
}
