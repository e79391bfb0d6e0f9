// blobpipe/format/layout.hpp — planning and writing blobs.
//
// A blob is laid out as
//   entry 0 | pad | entry 1 | pad | ... | index | footer
// First entry at 0; each next entry at align_up(prev.off + prev.len, ALIGN);
// a zero-length entry does not advance; the index starts at the aligned end
// of the data; the footer follows the index. Pads are zero.
// `plan` is pure arithmetic over the values' sizes; `write` copies the
// values into one buffer; `write_tail` produces only index + footer, for a
// blob whose entries travel separately (the streaming pipeline).
//
//   std::vector<float> x = {0, 1, 2, 3, 4, 5};
//   auto p = blobpipe::plan({"x"}, {blobpipe::value::tensor(x, {2, 3})}, NO_TAG);
//   std::vector<std::byte> blob(p->nbytes);
//   blobpipe::write(*p, blob).value();
//
// Source: plan, write, write_tail, BlobPlan (Python reference).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "blobpipe/format/dtype.hpp"
#include "blobpipe/format/entry.hpp"
#include "blobpipe/errors.hpp"
#include "blobpipe/format/footer.hpp"
#include "blobpipe/format/memory_kind.hpp"

namespace blobpipe {

/// Rounds `n` up to a multiple of ALIGN (64).
constexpr std::uint64_t align_up(std::uint64_t n) noexcept {
  return (n + (ALIGN - 1)) & ~std::uint64_t{ALIGN - 1};
}

/// Maps a C++ element type to its torch dtype name (float -> "float32").
template <class T> constexpr const char* torch_dtype_of() = delete;
template <> constexpr const char* torch_dtype_of<float>() { return "float32"; }
template <> constexpr const char* torch_dtype_of<double>() { return "float64"; }
template <> constexpr const char* torch_dtype_of<bool>() { return "bool"; }
template <> constexpr const char* torch_dtype_of<std::int8_t>() { return "int8"; }
template <> constexpr const char* torch_dtype_of<std::int16_t>() { return "int16"; }
template <> constexpr const char* torch_dtype_of<std::int32_t>() { return "int32"; }
template <> constexpr const char* torch_dtype_of<std::int64_t>() { return "int64"; }
template <> constexpr const char* torch_dtype_of<std::uint8_t>() { return "uint8"; }
template <> constexpr const char* torch_dtype_of<std::uint16_t>() { return "uint16"; }
template <> constexpr const char* torch_dtype_of<std::uint32_t>() { return "uint32"; }
template <> constexpr const char* torch_dtype_of<std::uint64_t>() { return "uint64"; }

/// A value to put in a blob: a description of memory the caller owns.
///
/// `data` points at the first element; with `strides` (in elements, one per
/// dim, as torch and numpy/itemsize report them) the value may be
/// non-contiguous, and `write` gathers it in logical C order. The bytes are
/// borrowed: they must stay valid and unchanged until the blob is written or
/// sent, unless `owner` keeps them alive (the plan holds a copy of `owner`).
struct value {
  char kind = KIND_TENSOR;          ///< 't', 'n' or 'p'
  std::string dtype;                ///< torch name or numpy dtype.str; "" for 'p'
  shape_t shape;                    ///< elements per dim; ignored for 'p'
  std::vector<std::int64_t> strides;  ///< elements per dim; empty = C-contiguous
  const std::byte* data = nullptr;  ///< first element (may be null when empty)
  std::uint64_t nbytes = 0;         ///< 'p' only: payload length in bytes
  std::shared_ptr<const void> owner;  ///< optional keep-alive for `data`
  /// Where `data` lives. Device memory is streamed by the sender through
  /// pinned staging buffers (docs/cuda.md); write()/write_entry() accept
  /// host memory only. Default host: no CUDA call is made.
  memory_kind memory = memory_kind::host;

  /// A contiguous torch tensor over `elems` with `shape` (elements).
  template <class T>
  static value tensor(std::span<const T> elems, shape_t shape,
                      std::string dtype = torch_dtype_of<T>()) {
    value v;
    v.kind = KIND_TENSOR;
    v.dtype = std::move(dtype);
    v.shape = std::move(shape);
    v.data = reinterpret_cast<const std::byte*>(elems.data());
    return v;
  }
  template <class T>
  static value tensor(const std::vector<T>& elems, shape_t shape,
                      std::string dtype = torch_dtype_of<T>()) {
    return tensor(std::span<const T>(elems), std::move(shape), std::move(dtype));
  }
  /// A contiguous 1-d tensor.
  template <class T>
  static value tensor(const std::vector<T>& elems) {
    return tensor(std::span<const T>(elems),
                  shape_t{static_cast<std::int64_t>(elems.size())});
  }
  /// A 0-d tensor (shape [], one element) over `x`, borrowed: as
  /// torch.tensor(0.5) is (a reward, a step count).
  template <class T>
  static value scalar(const T& x, std::string dtype = torch_dtype_of<T>()) {
    return tensor(std::span<const T>(&x, 1), shape_t{}, std::move(dtype));
  }
  /// A torch.bool tensor over `b` (borrowed, one byte per element).
  static value bools(std::span<const bool> b, shape_t shape) {
    return tensor(b, std::move(shape));
  }
  /// A 1-d torch.bool tensor from a std::vector<bool> (bit-packed, so
  /// copied: one byte 0 or 1 per element, owned by the value).
  static value bools(const std::vector<bool>& b);
  /// bfloat16 / float16 tensors from their bit patterns (uint16 each, as
  /// torch's .view(torch.int16) gives them), borrowed.
  static value bfloat16_bits(std::span<const std::uint16_t> bits, shape_t shape) {
    return tensor(bits, std::move(shape), "bfloat16");
  }
  static value float16_bits(std::span<const std::uint16_t> bits, shape_t shape) {
    return tensor(bits, std::move(shape), "float16");
  }
  /// Raw bytes described by a torch dtype name and shape.
  static value tensor_bytes(std::span<const std::byte> bytes, std::string dtype,
                            shape_t shape);
  /// Raw bytes described by a numpy dtype.str and shape.
  static value ndarray_bytes(std::span<const std::byte> bytes, std::string dtype,
                             shape_t shape);
  /// An opaque pickled payload (blobpipe::pickle, format/pickle.hpp, writes one).
  static value pickle(std::span<const std::byte> bytes);
};

/// One planned entry: its index row and where its bytes come from.
struct planned_entry {
  Entry entry;             ///< row as it will appear in the index
  value source;            ///< the value's memory (borrowed)
  std::size_t itemsize = 0;  ///< bytes per element; 1 for 'p'
  /// True when the source is C-contiguous and `entry.len` bytes can be taken
  /// from `source.data` as they are (the zero-copy path).
  bool contiguous = true;
};

/// A blob's layout: entries, the encoded index, and the total size.
struct BlobPlan {
  std::vector<planned_entry> entries;
  std::vector<std::byte> index;  ///< msgpack index bytes
  std::uint64_t nbytes = 0;      ///< whole blob, bytes
  tag_t tag = NO_TAG;

  /// Offset of the index from blob start, bytes (the aligned data end).
  std::uint64_t index_off() const noexcept {
    return nbytes - FOOTER_SIZE - index.size();
  }
};

/// Plans a blob. keys[i] names values[i]; keys need not be unique (the
/// index keeps rows in order). Tensor dtypes are canonicalised ("float" ->
/// "float32"). Pure: reads only the values' descriptions, never their bytes.
/// Errors: invalid_argument (keys/values sizes differ, negative dims,
/// strides rank != shape rank, null data with len > 0), unknown_kind,
/// unknown_dtype, too_large (index_off or index_len >= 2^32: the v3 footer
/// cannot address it). Source: plan (Python reference).
[[nodiscard]] result<BlobPlan> plan(std::span<const std::string> keys,
                                    std::span<const value> values,
                                    const tag_t& tag = NO_TAG);
[[nodiscard]] result<BlobPlan> plan(std::initializer_list<std::string> keys,
                                    std::initializer_list<value> values,
                                    const tag_t& tag = NO_TAG);

/// Incremental planner: entry i's offset depends only on entries before it,
/// so a streaming encoder can place (and send) each entry as it is added.
/// `finish()` produces the same BlobPlan `plan()` would.
class layout_builder {
 public:
  layout_builder() = default;
  /// A builder that plans into `storage`'s memory: its entries are
  /// dropped, its capacity kept (a sender hands a finished blob's entries
  /// to its next blob, so that a blob as large as the last moves none).
  explicit layout_builder(std::vector<planned_entry> storage) : entries_(std::move(storage)) {
    entries_.clear();
  }
  /// Makes room for `n` entries in all, so that adding them moves none.
  void reserve(std::size_t n) { entries_.reserve(n); }
  /// Adds one entry, planned in place at the end of the builder's entries.
  /// The pointer stays valid until the next add (or finish) that must grow
  /// the entries (none does within `reserve`). A refused add leaves the
  /// builder as it was: same entries, data_end() and finish().
  /// Errors: as `plan`, for this value; closed after finish.
  [[nodiscard]] result<const planned_entry*> add(std::string key, value v);
  /// As add(key, v), with `v`'s dtype looked up already: `dt` must be what
  /// `lookup_dtype(v.kind, v.dtype)` returned on this thread, with no
  /// lookup_dtype call since (the sender checks the entry's length against
  /// the consumer's limit with it first, so the value's dtype is looked up
  /// once). Null is always allowed: add then looks it up itself. Ignored
  /// for a pickle. `key` and `v` are moved from only when the add succeeds.
  [[nodiscard]] result<const planned_entry*> add(std::string&& key, value&& v, const dtype* dt);
  /// Encodes the index (one pass over the rows, straight into the plan's
  /// index buffer) and computes nbytes. Errors: too_large, closed.
  [[nodiscard]] result<BlobPlan> finish(const tag_t& tag);
  /// Bytes of data laid out so far (the aligned end of the last entry).
  std::uint64_t data_end() const noexcept { return cursor_; }
  std::size_t size() const noexcept { return entries_.size(); }

 private:
  std::vector<planned_entry> entries_;
  std::uint64_t cursor_ = 0;
  std::size_t index_bound_ = 5;  // bytes the index can take: its header and each row's bound
  bool finished_ = false;
};

/// Encodes an index (msgpack array of rows) from entries, as the reference
/// does: canonical smallest msgpack encodings, str (not bin) keys.
std::vector<std::byte> encode_index(std::span<const Entry> entries);

/// Appends row `e` as encode_index writes it ([key, off, len, kind, dtype,
/// shape], canonical msgpack) to `out`. The consumer digests announced
/// rows with it, to check a blob's tail without keeping the rows.
void append_index_row(const Entry& e, std::vector<std::byte>& out);

/// Copies one planned entry's bytes (gathering strided values) into
/// `out`, which must hold exactly entry.len bytes.
/// Errors: buffer_too_small, invalid_argument (the value is declared
/// memory_kind::cuda_device: the CPU cannot read it).
[[nodiscard]] result<void> write_entry(const planned_entry& pe,
                                       std::span<std::byte> out);

/// Writes the whole blob (entries, zero pads, index, footer) into `out`.
/// Returns bytes written (plan.nbytes).
/// Errors: buffer_too_small (out.size() < plan.nbytes), invalid_argument
/// (a value declared memory_kind::cuda_device).
/// Source: write (Python reference).
[[nodiscard]] result<std::uint64_t> write(const BlobPlan& p, std::span<std::byte> out);

/// Bytes `write_tail` produces: index + footer.
inline std::uint64_t tail_size(const BlobPlan& p) noexcept {
  return p.index.size() + FOOTER_SIZE;
}

/// Writes only the index and the v3 footer (tail_size(p) bytes): the end
/// of a blob whose entries are delivered separately.
/// Errors: buffer_too_small. Source: write_tail (Python reference).
[[nodiscard]] result<std::uint64_t> write_tail(const BlobPlan& p, std::span<std::byte> out);

}  // namespace blobpipe
