#include "blobpipe/format/index.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
#include <cstring>
#include <memory>
#include <new>

#include "checked.hpp"
#include "entry_codec.hpp"
#include "lib/format/index_rows.hpp"
#include "lib/format/le.hpp"
#include "msgpack_bounded.hpp"
#include "msgpack_reader.hpp"

namespace blobpipe {
namespace {

// Index depth: the array of rows, each row, each row's shape.
constexpr std::size_t index_depth = 3;
constexpr std::uint32_t row_fields = 6;
// read_index_file's first piece of an index, bytes (then doubling).
constexpr std::size_t first_index_read_bytes = std::size_t{1} << 20;

// Reads the header of row `i`, which must be an array of six fields.
result<void> read_row_header(detail::msgpack_reader& r, std::size_t i) {
  auto where = [i] { return detail::field_source{"index row", i}.text(); };
  if (!r.peek_array()) return make_error(errc::malformed_index, where() + " is not an array");
  const std::uint32_t fields = *r.array_header();  // scanned: the elements are there
  if (fields != row_fields)
    return make_error(errc::malformed_index,
                      where() + " has " + std::to_string(fields) + " fields, expected 6");
  return {};
}

// Reads the six fields of row `i` [key, off, len, kind, dtype, shape] into
// `e`, checking their types in the documented order.
result<void> read_row_fields(detail::msgpack_reader& r, std::size_t i, Entry& e) {
  const detail::field_source at{"index row", i};
  auto key = r.str();
  auto off = key ? r.uint() : std::nullopt;
  auto len = off ? r.uint() : std::nullopt;
  if (!len)
    return make_error(errc::malformed_index,
                      at.text() + ": key must be a str, off and len non-negative integers");
  e.key.assign(*key);
  e.off = *off;
  e.len = *len;
  return detail::read_kind_dtype_shape(r, r, r, e, at);
}

// Checks that [index_off, index_off + index_len) lies inside the blob and
// before its footer: the one rule every reader applies.
result<void> check_index_range(const footer& f, std::uint64_t nbytes) {
  const std::uint64_t footer_start = nbytes - f.size();  // nbytes >= f.size()
  auto end = detail::checked_add(f.index_off, f.index_len);
  if (!end || *end > footer_start)
    return make_error(errc::index_out_of_range,
                      "index [" + std::to_string(f.index_off) + ", +" +
                          std::to_string(f.index_len) + ") does not end before the footer at " +
                          std::to_string(footer_start));
  return {};
}

// Loads one element of `v` into `out` (size bytes), swapping to native
// order when the entry is stored in the other one. Complex elements swap
// each component.
void load_swapped(const entry_view& v, std::uint64_t byte_off, void* out, std::size_t size) {
  std::memcpy(out, v.bytes.data() + byte_off, size);
  if (v.type.is_native_order() || size == 1) return;
  auto* b = static_cast<unsigned char*>(out);
  const bool complex = v.type.type == scalar_type::complex64 ||
                       v.type.type == scalar_type::complex128;
  const std::size_t part = complex ? size / 2 : size;
  for (std::size_t base = 0; base < size; base += part)
    for (std::size_t k = 0; k < part / 2; ++k) std::swap(b[base + k], b[base + part - 1 - k]);
}

// Decodes a minifloat (float8 formats) with `e` exponent and `m` mantissa
// bits. fnuz formats have no negative zero and one NaN (0x80).
double minifloat(std::uint8_t x, int e, int m, int bias, bool fnuz, bool ieee_inf) {
  if (fnuz && x == 0x80) return std::numeric_limits<double>::quiet_NaN();
  const bool neg = (x >> 7) & 1;
  const int exp = (x >> m) & ((1 << e) - 1);
  const int man = x & ((1 << m) - 1);
  const int max_exp = (1 << e) - 1;
  double r;
  if (ieee_inf && exp == max_exp) {
    r = man == 0 ? std::numeric_limits<double>::infinity()
                 : std::numeric_limits<double>::quiet_NaN();
  } else if (!ieee_inf && !fnuz && exp == max_exp && man == (1 << m) - 1) {
    r = std::numeric_limits<double>::quiet_NaN();  // e4m3fn: S.1111.111
  } else if (exp == 0) {
    r = std::ldexp(static_cast<double>(man), 1 - bias - m);
  } else {
    r = std::ldexp(static_cast<double>(man + (1 << m)), exp - bias - m);
  }
  return neg ? -r : r;
}

double half_to_double(std::uint16_t h) {
  const bool neg = h >> 15;
  const int exp = (h >> 10) & 0x1F;
  const int man = h & 0x3FF;
  double r;
  if (exp == 0x1F)
    r = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp == 0)
    r = std::ldexp(man, -24);
  else
    r = std::ldexp(man + 1024, exp - 25);
  return neg ? -r : r;
}

// Component i of a complex entry: element i/2, real (even i) or imaginary
// part; each part is byte-swapped on its own.
template <class Part>
double complex_part(const entry_view& v, std::uint64_t i) {
  entry_view part = v;
  part.type.type = sizeof(Part) == 4 ? scalar_type::float32 : scalar_type::float64;
  Part x;
  load_swapped(part, i * sizeof(Part), &x, sizeof(Part));
  return x;
}

}  // namespace

namespace {

result<std::vector<Entry>> parse_rows(std::span<const std::byte> index, std::uint64_t data_end,
                                      std::size_t max_rows) {
  // A declared row count over the caller's bound fails before any scan.
  detail::msgpack_reader r(index);
  if (r.peek_array()) {
    detail::msgpack_reader head = r;
    if (auto n = head.array_header(); n && *n > max_rows)
      return make_error(errc::malformed_index, "index has " + std::to_string(*n) +
                                                   " rows, more than the " +
                                                   std::to_string(max_rows) + " allowed");
  }
  // Pass 1: the whole index is well-formed msgpack within its limits, and
  // how many rows (arrays of six) it holds before anything else.
  auto proven = detail::scan_bounded(index, index_depth, row_fields, "index");
  if (!proven) return proven.err();
  auto rows = r.array_header();
  if (!rows) return make_error(errc::malformed_index, "index is not a msgpack array");
  // Pass 2, row by row. Reserve only the rows the bytes hold, never the
  // count the header claims: the first row that is not an array of six
  // fails read_row_header, so the vector never grows past the reserve.
  std::vector<Entry> entries;
  entries.reserve(*proven);
  for (std::uint32_t i = 0; i < *rows; ++i) {
    if (auto ok = read_row_header(r, i); !ok) return ok.err();
    Entry& e = entries.emplace_back();
    if (auto ok = read_row_fields(r, i, e); !ok) return ok.err();
    if (auto ok = validate_entry(e, data_end); !ok) return ok.err();
  }
  return entries;
}

}  // namespace

result<std::vector<Entry>> parse_index(std::span<const std::byte> index, std::uint64_t data_end,
                                       std::size_t max_rows) {
  // The rows' memory is bounded by the index size (see index.hpp), but a
  // large index can still exceed what this process may allocate.
  try {
    return parse_rows(index, data_end, max_rows);
  } catch (const std::bad_alloc&) {
    return allocation_error("out of memory for the entries of an index", index.size());
  }
}

namespace detail {

result<std::vector<Entry>> read_known_rows(std::span<const std::byte> index, std::size_t rows) {
  try {
    msgpack_reader r(index);
    const auto n = r.array_header();
    if (!n || *n != rows)
      return make_error(errc::malformed_index,
                        "index is not an array of the " + std::to_string(rows) + " rows expected");
    std::vector<Entry> entries;
    entries.reserve(std::min(rows, index.size() / 7));
    for (std::size_t i = 0; i < rows; ++i) {
      if (auto ok = read_row_header(r, i); !ok) return ok.err();
      Entry& e = entries.emplace_back();
      if (auto ok = read_row_fields(r, i, e); !ok) return ok.err();
    }
    return entries;
  } catch (const std::bad_alloc&) {
    return allocation_error("out of memory for the known rows of an index", index.size());
  }
}

}  // namespace detail

result<blob_index> read_index(std::span<const std::byte> blob) {
  auto f = read_footer(blob);
  if (!f) return f.err();
  if (auto r = check_index_range(*f, blob.size()); !r) return r.err();
  auto entries = parse_index(blob.subspan(f->index_off, f->index_len), f->index_off);
  if (!entries) return entries.err();
  return blob_index{*f, std::move(*entries), blob.size()};
}

result<blob_index> read_index_file(std::FILE* file, std::uint64_t off, std::uint64_t nbytes) {
  auto os_error = [](errc c, const std::string& what) {
    return make_error(c, what + ": " + std::strerror(errno));
  };
  if (file == nullptr) return make_error(errc::invalid_argument, "read_index_file: null file");
  if (fseeko(file, 0, SEEK_END) != 0) return os_error(errc::io, "cannot seek");
  const off_t size = ftello(file);
  if (size < 0) return os_error(errc::io, "cannot tell file size");
  const auto file_size = static_cast<std::uint64_t>(size);
  if (off > file_size)
    return make_error(errc::too_small, "offset " + std::to_string(off) + " is past the end (" +
                                           std::to_string(file_size) + " bytes)");
  if (nbytes == 0) nbytes = file_size - off;
  auto end = detail::checked_add(off, nbytes);
  if (!end || *end > file_size)
    return make_error(errc::too_small, "file of " + std::to_string(file_size) +
                                           " bytes is shorter than offset + nbytes");
  auto read_at = [&](std::uint64_t pos, std::span<std::byte> out) -> result<void> {
    if (fseeko(file, static_cast<off_t>(pos), SEEK_SET) != 0)
      return os_error(errc::io, "cannot seek");
    // The size was checked above: a short read means the read failed or
    // the file ended early (it shrank, or is a procfs-like file whose size
    // says nothing).
    if (std::fread(out.data(), 1, out.size(), file) != out.size())
      return std::ferror(file) ? os_error(errc::io, "short read")
                               : make_error(errc::io, "short read: the file ended early");
    return {};
  };
  // Read 1: the footer (at most 32 bytes from the blob's end).
  std::byte tail[FOOTER_SIZE];
  const std::size_t tail_len = static_cast<std::size_t>(std::min<std::uint64_t>(nbytes, FOOTER_SIZE));
  if (auto r = read_at(off + nbytes - tail_len, {tail, tail_len}); !r) return r.err();
  auto f = read_footer({tail, tail_len});
  if (!f) return f.err();
  if (auto r = check_index_range(*f, nbytes); !r) return r.err();
  // Read 2: the index, whose length is now bounded by the blob's size. A
  // file may still claim gigabytes of it that are not on disk (a sparse
  // file's hole reads as zeros), so it is read in pieces, doubling from
  // first_index_read_bytes: each piece is checked to still begin an array
  // of rows before the next is allocated, and memory grows only with bytes
  // that could be a real index. A failed allocation is an error, not an
  // exception.
  std::vector<std::byte> index;
  for (std::size_t have = 0; have < f->index_len;) {
    const std::size_t next = std::min<std::size_t>(
        f->index_len, std::max<std::size_t>(first_index_read_bytes, 2 * have));
    try {
      index.resize(next);
    } catch (const std::bad_alloc&) {
      return allocation_error("out of memory for the index", next);
    }
    if (auto r = read_at(off + f->index_off + have, std::span(index).subspan(have)); !r)
      return r.err();
    have = next;
    if (have < f->index_len)
      if (auto p = detail::scan_table_prefix(index, f->index_len, index_depth, row_fields,
                                             "index");
          !p)
        return p.err();
  }
  auto entries = parse_index(index, f->index_off);
  if (!entries) return entries.err();
  return blob_index{*f, std::move(*entries), nbytes};
}

namespace {

// What a file that is neither regular nor a directory is, for messages.
const char* special_file_kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a pipe or FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

}  // namespace

result<file_ptr> open_blob_file(const std::string& path) {
  auto os_error = [&](const char* what) {
    return make_error(errc::io,
                      std::string(what) + " " + quote(path, SIZE_MAX) + ": " + std::strerror(errno));
  };
  // O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer,
  // possibly forever, before fstat could refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return os_error("cannot open");
  file_ptr f(::fdopen(fd, "rb"));
  if (!f) {
    auto e = os_error("cannot open");
    ::close(fd);
    return e;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) return os_error("cannot stat");
  if (S_ISDIR(st.st_mode)) return make_error(errc::io, quote(path, SIZE_MAX) + " is a directory");
  if (!S_ISREG(st.st_mode))
    return make_error(errc::io,
                      quote(path, SIZE_MAX) + " is " + special_file_kind(st.st_mode) +
                          ", not a regular file; the footer is at the blob's end, so the file "
                          "must be seekable (save a piped blob to a file first)");
  // Back to blocking reads, as fopen would have opened it.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) return os_error("cannot read");
  return f;
}

result<blob_index> read_index_file(const std::string& path, std::uint64_t off,
                                   std::uint64_t nbytes) {
  auto file = open_blob_file(path);
  if (!file) return file.err();
  return read_index_file(file->get(), off, nbytes);
}

result<entry_view> view_entry(const Entry& e, std::span<const std::byte> entry_bytes) {
  if (entry_bytes.size() != e.len)
    return make_error(errc::entry_out_of_range,
                      "entry " + quote(e.key) + " has " +
                          std::to_string(entry_bytes.size()) + " bytes, index says " +
                          std::to_string(e.len));
  // Validate as if the entry sat at offset 0 of a region exactly its size.
  Entry at_zero = e;
  at_zero.off = 0;
  if (auto r = validate_entry(at_zero, e.len); !r) return r.err();
  return view_valid_entry(e, entry_bytes);
}

entry_view view_valid_entry(const Entry& e, std::span<const std::byte> entry_bytes,
                            const dtype* type) {
  entry_view v;
  v.entry = &e;
  v.bytes = entry_bytes;
  if (e.kind == KIND_PICKLE) {
    v.type = *lookup_dtype(KIND_TENSOR, "uint8");
    v.type.kind = KIND_PICKLE;
    v.type.name.clear();
    v.shape = {static_cast<std::int64_t>(e.len)};
    return v;
  }
  v.type = type ? *type : *lookup_dtype(e.kind, e.dtype ? std::string_view(*e.dtype) : "float32");
  // Copied straight into the view (a `?:` of the row's shape and a new one
  // made a temporary copy first: two allocations per entry).
  if (e.shape) v.shape = *e.shape;
  else v.shape.assign(1, static_cast<std::int64_t>(v.type.itemsize ? e.len / v.type.itemsize : 0));
  return v;
}

result<entry_view> decode_entry(std::span<const std::byte> blob, const Entry& e) {
  auto end = detail::checked_add(e.off, e.len);
  if (!end || *end > blob.size())
    return make_error(errc::entry_out_of_range,
                      "entry " + quote(e.key) + " [" + std::to_string(e.off) + ", +" +
                          std::to_string(e.len) + ") runs past the blob's " +
                          std::to_string(blob.size()) + " bytes");
  return view_entry(e, blob.subspan(e.off, e.len));
}

std::uint64_t entry_view::numel() const noexcept {
  return detail::checked_product(shape, 1).value_or(UINT64_MAX);
}

namespace detail {
void load_element(const entry_view& v, std::uint64_t i, void* out, std::size_t size) {
  // REQUIRES (documented on at<T>): size == itemsize and i < numel().
  load_swapped(v, i * v.type.itemsize, out, size);
}
}  // namespace detail

result<double> entry_view::as_double(std::uint64_t i) const {
  const bool complex = type.type == scalar_type::complex64 || type.type == scalar_type::complex128;
  const std::uint64_t count = complex ? 2 * numel() : numel();
  if (i >= count)
    return make_error(errc::invalid_argument, "element " + std::to_string(i) + " of " +
                                                  std::to_string(count));
  auto load = [&]<class T>(T* /*tag*/, std::uint64_t byte_off) {
    T x;
    load_swapped(*this, byte_off, &x, sizeof(T));
    return x;
  };
  const std::uint64_t at = i * type.itemsize;
  switch (type.type) {
    case scalar_type::bool_: return static_cast<double>(load((std::uint8_t*)nullptr, at) != 0);
    case scalar_type::int8: return static_cast<double>(load((std::int8_t*)nullptr, at));
    case scalar_type::int16: return static_cast<double>(load((std::int16_t*)nullptr, at));
    case scalar_type::int32: return static_cast<double>(load((std::int32_t*)nullptr, at));
    case scalar_type::int64: return static_cast<double>(load((std::int64_t*)nullptr, at));
    case scalar_type::uint8: return static_cast<double>(load((std::uint8_t*)nullptr, at));
    case scalar_type::uint16: return static_cast<double>(load((std::uint16_t*)nullptr, at));
    case scalar_type::uint32: return static_cast<double>(load((std::uint32_t*)nullptr, at));
    case scalar_type::uint64: return static_cast<double>(load((std::uint64_t*)nullptr, at));
    case scalar_type::float16: return half_to_double(load((std::uint16_t*)nullptr, at));
    case scalar_type::bfloat16: {
      std::uint32_t bits = std::uint32_t{load((std::uint16_t*)nullptr, at)} << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case scalar_type::float32: return load((float*)nullptr, at);
    case scalar_type::float64: return load((double*)nullptr, at);
    case scalar_type::float8_e4m3fn: return minifloat(load((std::uint8_t*)nullptr, at), 4, 3, 7, false, false);
    case scalar_type::float8_e5m2: return minifloat(load((std::uint8_t*)nullptr, at), 5, 2, 15, false, true);
    case scalar_type::float8_e4m3fnuz: return minifloat(load((std::uint8_t*)nullptr, at), 4, 3, 8, true, false);
    case scalar_type::float8_e5m2fnuz: return minifloat(load((std::uint8_t*)nullptr, at), 5, 2, 16, true, false);
    case scalar_type::complex64:
      return complex_part<float>(*this, i);
    case scalar_type::complex128:
      return complex_part<double>(*this, i);
    default:
      return make_error(errc::invalid_argument,
                        "dtype " + quote(type.name) + " has no numeric value");
  }
}

value materialized::as_value() const {
  value v;
  v.kind = entry.kind;
  v.data = storage.get();
  v.owner = storage;
  if (entry.kind == KIND_PICKLE) {
    v.nbytes = entry.len;
  } else {
    v.dtype = type.name;
    v.shape = shape;
  }
  return v;
}

materialized materialize(const entry_view& v) {
  materialized m;
  m.entry = *v.entry;
  m.type = v.type;
  m.shape = v.shape;
  // Over-allocate and alias an ALIGN-aligned pointer into the block, so the
  // copy suits vectorised readers; the aliasing shared_ptr owns the block.
  const std::size_t n = v.bytes.size();
  std::shared_ptr<std::byte[]> block = std::make_shared<std::byte[]>(n + ALIGN);
  auto addr = reinterpret_cast<std::uintptr_t>(block.get());
  std::byte* aligned = block.get() + (align_up(addr) - addr);
  if (n) std::memcpy(aligned, v.bytes.data(), n);
  m.storage = std::shared_ptr<std::byte[]>(block, aligned);
  return m;
}

}  // namespace blobpipe
