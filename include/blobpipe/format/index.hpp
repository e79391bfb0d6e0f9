// blobpipe/format/index.hpp — reading blobs: footer, index, and typed entry views.
//
// Every reader validates before it uses a number from the bytes, in a fixed
// order (docs/format.md "Validation order"): footer inside the blob; index
// range inside the blob and before the footer; msgpack well formed with
// sizes bounded by the bytes present; then row by row: six fields of the
// right types, a known kind, the entry inside the data region
// (overflow-checked), a known dtype, prod(shape) x itemsize == len. Nothing
// is allocated in proportion to a number read from the blob before that
// number is checked against the bytes actually present.
//
//   auto idx = blobpipe::read_index(blob);              // footer + index
//   auto v = blobpipe::decode_entry(blob, idx->entries[0]);  // zero copy
//   float first = v->at<float>(0);
//
// Source: read_index, read_index_file, decode_entry (Python reference).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "blobpipe/format/dtype.hpp"
#include "blobpipe/format/entry.hpp"
#include "blobpipe/errors.hpp"
#include "blobpipe/format/footer.hpp"
#include "blobpipe/format/layout.hpp"

namespace blobpipe {

/// A blob's parsed footer and index.
struct blob_index {
  footer foot;                 ///< version, index_off, index_len, tag
  std::vector<Entry> entries;  ///< rows in index order
  std::uint64_t nbytes = 0;    ///< whole blob, bytes

  /// Data region end = index_off (entries must end at or before it).
  std::uint64_t data_end() const noexcept { return foot.index_off; }
};

/// Parses an index (the msgpack bytes alone) into entries and validates
/// each against the data region [0, data_end). `max_rows` bounds the row
/// count the index's array header declares, checked before anything else
/// is read (a streaming consumer passes the entries it has seen).
///
/// Memory: the index is read in place, row by row; no msgpack object tree
/// is built and nothing is reserved from a count the bytes have not proven.
/// At most 23 x index.size() + 4 KiB is allocated (requested bytes, the
/// returned vector included): the vector holds at most one 160-byte Entry
/// per 7 index bytes (the smallest row), and a row's own heap (key and
/// dtype past 15 bytes, 8 bytes per shape dim past shape_inline_dims) is
/// at most 8 bytes per byte of that row. test/parse_memory_test.cpp checks
/// the bound with a counting allocator.
///
/// Errors: malformed_index (also: more rows than max_rows),
/// entry_out_of_range, shape_mismatch, unknown_kind, unknown_dtype,
/// too_large (the entries cannot be allocated: std::bad_alloc never
/// escapes).
[[nodiscard]] result<std::vector<Entry>> parse_index(std::span<const std::byte> index,
                                                     std::uint64_t data_end,
                                                     std::size_t max_rows = SIZE_MAX);

/// Reads the footer and index of a whole in-memory blob. Does not touch
/// entry bytes. Errors: too_small, bad_footer, index_out_of_range, and
/// those of parse_index (too_large included).
/// Source: read_index (Python reference).
[[nodiscard]] result<blob_index> read_index(std::span<const std::byte> blob);

/// Closes a std::FILE.
struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using file_ptr = std::unique_ptr<std::FILE, file_closer>;

/// Opens `path` to read a blob from it. Only a regular file will do: the
/// footer is at the blob's end, so the file must be seekable; a pipe,
/// FIFO, device or directory is refused, and opening a FIFO never waits
/// for a writer. Errors: io (the message names the path and the OS error
/// or the file's type).
[[nodiscard]] result<file_ptr> open_blob_file(const std::string& path);

/// Reads the blob stored at byte `off` of a file, `nbytes` long: the
/// footer first, then the index — never the entry bytes. The index is
/// read in pieces (1 MiB, then doubling), each checked to still begin an
/// array of six-field rows, so a file that claims a large index it does
/// not hold (a sparse file's hole reads as zeros) is refused after its
/// first piece, with memory bounded by the bytes that could be an index.
/// `nbytes` = 0 means "to the end of the file". Errors: as read_index;
/// too_small when the file is shorter than off + nbytes; io when the file
/// cannot be opened (as open_blob_file), seeked or read (the message names
/// the OS error); too_large when the index (at most the file's size) or
/// its entries cannot be allocated; invalid_argument for a null `file`.
/// Source: read_index_file (Python reference).
[[nodiscard]] result<blob_index> read_index_file(const std::string& path,
                                                 std::uint64_t off = 0,
                                                 std::uint64_t nbytes = 0);
[[nodiscard]] result<blob_index> read_index_file(std::FILE* file,
                                                 std::uint64_t off,
                                                 std::uint64_t nbytes);

/// A zero-copy, typed view of one entry's bytes. Valid as long as the
/// bytes it views.
struct entry_view {
  const Entry* entry = nullptr;      ///< the row this view decodes
  std::span<const std::byte> bytes;  ///< exactly entry->len bytes
  /// Parsed dtype; for 'p' entries, a 1-byte placeholder (type uint8).
  dtype type;
  shape_t shape;                     ///< elements; {len} for 'p'

  /// Number of elements (prod(shape)); bytes for 'p'. A view from
  /// decode_entry or view_entry has a shape whose product fits 64 bits
  /// (validate_entry checks it, whatever the item size); for a view built
  /// by hand whose product overflows, 2^64 - 1.
  std::uint64_t numel() const noexcept;

  /// Element `i` (flat, C order) read as T with the entry's byte order
  /// honoured. REQUIRES: sizeof(T) == type.itemsize and i < numel().
  /// Works on unaligned bytes.
  template <class T>
  T at(std::uint64_t i) const;

  /// Element `i` converted to double: bool, ints, float16, bfloat16,
  /// float32/64 and the four float8 formats. For complex types, the real
  /// part at 2*i and the imaginary at 2*i+1 (i < 2*numel()).
  /// Errors: invalid_argument (index past the end, or a string, datetime
  /// or void dtype).
  [[nodiscard]] result<double> as_double(std::uint64_t i) const;
};

/// Decodes one entry of a blob: checks its range against the blob and
/// its dtype/shape against its length, then returns a view (no copy).
/// Errors: entry_out_of_range, shape_mismatch, unknown_kind, unknown_dtype.
/// Source: decode_entry (Python reference).
[[nodiscard]] result<entry_view> decode_entry(std::span<const std::byte> blob,
                                              const Entry& e);

/// A view of one entry whose bytes are held on their own (`entry_bytes` is
/// exactly the entry's `len` bytes, not the whole blob), as a streaming
/// consumer holds them. Errors: entry_out_of_range (size differs from
/// e.len), shape_mismatch, unknown_kind, unknown_dtype.
[[nodiscard]] result<entry_view> view_entry(const Entry& e,
                                            std::span<const std::byte> entry_bytes);

/// The view of an entry validate_entry accepted (at its offset or at 0),
/// over `entry_bytes` (e.len bytes), built without checking again: for
/// callers that validated the row already (the streaming consumer).
/// `type`, when not null, is the row's dtype as that check found it (the
/// decoder's entry_announcement::type), copied into the view instead of
/// looked up by name again.
/// REQUIRES: validate_entry passed for `e`; entry_bytes.size() == e.len;
/// type is null or is the dtype of e.kind and e.dtype.
entry_view view_valid_entry(const Entry& e, std::span<const std::byte> entry_bytes,
                            const dtype* type = nullptr);

/// An owning copy of a decoded entry (bytes copied, 64-byte aligned).
struct materialized {
  Entry entry;
  dtype type;
  shape_t shape;
  std::shared_ptr<std::byte[]> storage;  ///< entry.len bytes, ALIGN-aligned
  std::span<const std::byte> bytes() const noexcept {
    return {storage.get(), static_cast<std::size_t>(entry.len)};
  }
  /// A `value` over this copy (keeps `storage` alive), to re-encode it.
  value as_value() const;
};

/// Copies a view's bytes into memory it owns. Source: materialize
/// (Python reference).
materialized materialize(const entry_view& v);

// ---- implementation of the template ----
namespace detail {
void load_element(const entry_view& v, std::uint64_t i, void* out, std::size_t size);
}
template <class T>
T entry_view::at(std::uint64_t i) const {
  T out{};
  detail::load_element(*this, i, &out, sizeof(T));
  return out;
}

}  // namespace blobpipe
