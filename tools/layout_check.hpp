// tools/layout_check.hpp — what `verify` refuses and `inspect` reports as
// findings in a blob whose footer and index are otherwise valid.
//
// The reference writes entries in order, each at the aligned end of the one
// before, and the footer right after the index. A blob that parses may still
// break that: bytes between the index and the footer (data a reader never
// sees, or a 64 GiB sparse tail), or entries that overlap or run out of
// order (two keys sharing bytes). The format readers accept such blobs, as
// the reference's do; `blobpipe verify` refuses them.
//
//   for (const finding& f : check_layout(idx)) std::cout << f.kind << ": " << f.message;
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "blobpipe/format/index.hpp"

namespace blobpipe::cli {

/// One class of layout problem, with its first instance.
struct finding {
  std::string kind;      ///< "bytes_after_index", "entries_out_of_order", "entries_overlap"
  errc code;             ///< the category `verify` reports it under
  std::uint64_t count;   ///< how many instances (bytes, for bytes_after_index)
  std::string message;   ///< the first instance, one line
};

/// The layout findings of a parsed blob, at most one per kind, in the order
/// above. Memory: one 16-byte record per entry while it runs.
std::vector<finding> check_layout(const blob_index& idx);

}  // namespace blobpipe::cli
