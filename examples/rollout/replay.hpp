// examples/rollout/replay.hpp — blobs read from disk for --replay.
//
// Every *.blob of a directory is read whole and checked with read_index
// (footer, index, every entry's range, dtype and shape); blobs that fail
// are skipped with the reason, so a directory of golden cases, valid and
// invalid, can be replayed as it is. Workers then emit each entry's bytes
// with its key, kind, dtype and shape under the blob's tag, and the
// trainer compares what arrives with these bytes.
//
//   auto set = rollout::load_replay("../shared/golden");
//   for (const auto& s : set.skipped) std::cout << "skip " << s << "\n";
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "blobpipe/errors.hpp"
#include "blobpipe/format/index.hpp"

namespace rollout {

/// One valid blob: its bytes and parsed index.
struct replay_blob {
  std::string name;              ///< file name, e.g. "single_f32.blob"
  std::vector<std::byte> bytes;  ///< the whole file
  blobpipe::blob_index index;
  std::uint64_t entry_bytes() const noexcept;  ///< sum of entry lengths
};

struct replay_set {
  std::vector<replay_blob> blobs;     ///< valid ones, sorted by file name
  std::vector<std::string> skipped;   ///< "name: errc_name: message"
};

/// Reads DIR/*.blob (not recursive). Errors: invalid_argument (not a
/// readable directory, or a file that cannot be read).
[[nodiscard]] blobpipe::result<replay_set> load_replay(const std::string& dir);

/// The bytes of entry `i` of `b` (checked by load_replay).
std::span<const std::byte> entry_bytes(const replay_blob& b, std::size_t i);

/// The value to emit for entry `i` of `b`: its bytes with the row's kind,
/// dtype (a tensor row without one is float32, as the format says) and
/// shape. Borrows from `b`.
blobpipe::value entry_value(const replay_blob& b, std::size_t i);

}  // namespace rollout
