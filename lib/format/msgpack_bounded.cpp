#include "msgpack_bounded.hpp"

#include <msgpack.hpp>

#include <exception>
#include <string>

namespace blobpipe::detail {
namespace {

// Enforces the limits msgpack-cxx's bounded unpack would (sizes, depth)
// and counts the leading rows; stores nothing.
class scan_visitor : public msgpack::null_visitor {
 public:
  scan_visitor(std::size_t cap, std::size_t max_depth, std::uint32_t row_fields,
               bool table_only = false)
      : cap_(cap), max_depth_(max_depth), row_fields_(row_fields), table_only_(table_only) {}

  bool visit_nil() { return scalar(); }
  bool visit_boolean(bool) { return scalar(); }
  bool visit_positive_integer(std::uint64_t) { return scalar(); }
  bool visit_negative_integer(std::int64_t) { return scalar(); }
  bool visit_float32(float) { return scalar(); }
  bool visit_float64(double) { return scalar(); }
  bool visit_str(const char*, std::uint32_t n) { return sized(n) && scalar(); }
  bool visit_bin(const char*, std::uint32_t n) { return sized(n) && scalar(); }
  bool visit_ext(const char*, std::uint32_t n) { return sized(n) && scalar(); }
  bool start_array(std::uint32_t n) {
    if (!container(n)) return false;
    if (depth_ == 2) {
      if (n == row_fields_ && !rows_broken_) ++rows_;
      else rows_broken_ = true;
    }
    return table_ok();
  }
  bool end_array() { return close(); }
  bool start_map(std::uint32_t n) {
    if (!container(n)) return false;
    if (depth_ <= 2) rows_broken_ = true;  // the outermost value, or a row
    return table_ok();
  }
  bool end_map() { return close(); }
  void parse_error(std::size_t, std::size_t) { why_ = "not valid msgpack"; }
  void insufficient_bytes(std::size_t, std::size_t) {
    why_ = "truncated msgpack";
    truncated_ = true;
  }

  std::uint32_t rows() const noexcept { return rows_; }
  const char* why() const noexcept { return why_; }
  bool truncated() const noexcept { return truncated_; }

 private:
  // A scalar directly inside the outermost array ends the run of rows.
  bool scalar() {
    if (depth_ <= 1) rows_broken_ = true;
    return table_ok();
  }
  // In table_only mode the first element that is not a row ends the scan.
  bool table_ok() {
    if (!table_only_ || !rows_broken_) return true;
    why_ = "not an array of rows";
    return false;
  }
  bool sized(std::uint32_t n) {
    if (n <= cap_) return true;
    why_ = "a size exceeds the input";
    return false;
  }
  bool container(std::uint32_t n) {
    if (depth_ == max_depth_) {
      why_ = "nesting too deep";
      return false;
    }
    if (n > cap_) {
      why_ = "an array or map claims more elements than the input has bytes";
      return false;
    }
    ++depth_;
    return true;
  }
  bool close() {
    --depth_;
    return true;
  }

  std::size_t cap_, max_depth_;
  std::uint32_t row_fields_;
  bool table_only_;
  bool truncated_ = false;
  std::size_t depth_ = 0;  // containers open
  std::uint32_t rows_ = 0;
  bool rows_broken_ = false;
  const char* why_ = nullptr;
};

}  // namespace

result<std::uint32_t> scan_bounded(std::span<const std::byte> bytes, std::size_t max_depth,
                                   std::uint32_t row_fields, std::string_view what) {
  // Every element of an array or map takes at least one byte, and every str
  // or bin byte is present in the input, so the input length bounds them all.
  scan_visitor v(bytes.size(), max_depth, row_fields);
  std::size_t off = 0;
  bool ok;
  try {
    ok = msgpack::parse(reinterpret_cast<const char*>(bytes.data()), bytes.size(), off, v);
  } catch (const std::exception& e) {  // msgpack's own checks (ext size)
    return make_error(errc::malformed_index,
                      std::string(what) + ": not valid msgpack (" + e.what() + ")");
  }
  if (!ok)
    return make_error(errc::malformed_index,
                      std::string(what) + ": " + (v.why() ? v.why() : "not valid msgpack"));
  if (off != bytes.size())
    return make_error(errc::malformed_index,
                      std::string(what) + ": " + std::to_string(bytes.size() - off) +
                          " trailing bytes after the msgpack object");
  return v.rows();
}

result<void> scan_table_prefix(std::span<const std::byte> prefix, std::size_t total_bytes,
                               std::size_t max_depth, std::uint32_t row_fields,
                               std::string_view what) {
  scan_visitor v(total_bytes, max_depth, row_fields, /*table_only=*/true);
  std::size_t off = 0;
  bool ok;
  try {
    ok = msgpack::parse(reinterpret_cast<const char*>(prefix.data()), prefix.size(), off, v);
  } catch (const std::exception& e) {
    return make_error(errc::malformed_index,
                      std::string(what) + ": not valid msgpack (" + e.what() + ")");
  }
  if (!ok && v.truncated()) return {};  // good so far: the rest is still to come
  if (!ok)
    return make_error(errc::malformed_index,
                      std::string(what) + ": " + (v.why() ? v.why() : "not valid msgpack"));
  if (off != prefix.size() || prefix.size() < total_bytes)  // the value ended early
    return make_error(errc::malformed_index,
                      std::string(what) + ": " + std::to_string(total_bytes - off) +
                          " trailing bytes after the msgpack object");
  return {};
}

}  // namespace blobpipe::detail
