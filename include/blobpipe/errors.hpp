// blobpipe/errors.hpp — one error vocabulary for the whole library.
//
// Every failure blobpipe reports is a `std::error_code` in
// `blobpipe::category()`. Synchronous calls return `result<T>` (a value or an
// error code plus a one-line message); async operations complete with
// `(std::error_code, T)`. Tests compare codes, never message text.
//
//   auto idx = blobpipe::read_index(bytes);
//   if (!idx) std::cerr << blobpipe::errc_name(idx.code()) << ": " << idx.message();
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>

namespace blobpipe {

/// Error codes. The first eight are the format categories of the golden
/// manifest (`expected_error`) and of the CLI's `blobpipe: CATEGORY:` line.
enum class errc {
  // format (lib/format)
  too_small = 1,       ///< fewer bytes than the smallest footer (16)
  bad_footer,          ///< magic or version not recognised
  index_out_of_range,  ///< index range not inside the blob before the footer
  malformed_index,     ///< index bytes are not a well-formed v3 index
  entry_out_of_range,  ///< an entry's byte range leaves the data region
  shape_mismatch,      ///< prod(shape) x itemsize != len
  unknown_kind,        ///< kind is not t, n or p
  unknown_dtype,       ///< dtype name not known for its kind
  too_large,           ///< blob the v3 footer cannot address (>= 2^32)
  buffer_too_small,    ///< caller's output buffer shorter than plan.nbytes
  invalid_argument,    ///< caller broke a documented precondition
  // transport / pipeline
  closed,              ///< this side closed the object
  peer_closed,         ///< the peer closed the connection
  peer_failed,         ///< the peer reset or failed
  protocol_violation,  ///< the peer broke docs/wire.md
  timed_out,           ///< a configured timeout expired
  aborted,             ///< the producer abandoned the blob (blob_abort)
  // device
  cuda_failure,        ///< a CUDA runtime call failed
  // files (read_index_file, open_blob_file, the consumer's file_slot)
  io,                  ///< a file cannot be opened, seeked, read or written, or is not regular
};

/// The category of every blobpipe error code (name "blobpipe").
const std::error_category& category() noexcept;

inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), category()};
}

/// The short, stable name of a code, as the CLI prints it ("bad_footer");
/// "unknown" for a code outside the blobpipe category.
const char* errc_name(errc e) noexcept;
const char* errc_name(std::error_code ec) noexcept;

/// An error: a code and a one-line message naming what failed.
struct error {
  std::error_code code;
  std::string message;
};

/// Thrown by the throwing conveniences (`result::value()`).
class exception : public std::system_error {
 public:
  explicit exception(const error& e) : std::system_error(e.code, e.message) {}
};

/// A value or an error. Must be checked: `if (!r) ... r.err()`.
template <class T>
class [[nodiscard]] result {
 public:
  result(T v) : v_(std::move(v)) {}  // NOLINT: implicit by design
  result(error e) : v_(std::move(e)) {}  // NOLINT
  result(errc c, std::string msg) : v_(error{make_error_code(c), std::move(msg)}) {}

  explicit operator bool() const noexcept { return v_.index() == 0; }
  bool has_value() const noexcept { return v_.index() == 0; }

  /// The value; throws `blobpipe::exception` when this holds an error.
  T& value() & { check(); return std::get<0>(v_); }
  const T& value() const& { check(); return std::get<0>(v_); }
  T&& value() && { check(); return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// REQUIRES: !has_value().
  const error& err() const& { return std::get<1>(v_); }
  std::error_code code() const noexcept {
    return has_value() ? std::error_code{} : std::get<1>(v_).code;
  }
  /// The error's one-line message; "" when this holds a value.
  const std::string& message() const {
    static const std::string none;
    return has_value() ? none : std::get<1>(v_).message;
  }

 private:
  void check() const {
    if (!has_value()) throw exception(std::get<1>(v_));
  }
  std::variant<T, error> v_;
};

/// `result` for operations with no value.
template <>
class [[nodiscard]] result<void> {
 public:
  result() = default;
  result(error e) : e_(std::move(e)) {}  // NOLINT
  result(errc c, std::string msg) : e_(error{make_error_code(c), std::move(msg)}) {}
  explicit operator bool() const noexcept { return !e_; }
  bool has_value() const noexcept { return !e_; }
  void value() const { if (e_) throw exception(*e_); }
  const error& err() const& { return *e_; }
  std::error_code code() const noexcept { return e_ ? e_->code : std::error_code{}; }
  const std::string& message() const {
    static const std::string none;
    return e_ ? e_->message : none;
  }

 private:
  std::optional<error> e_;
};

/// Builds an `error` in the blobpipe category.
inline error make_error(errc c, std::string msg) {
  return error{make_error_code(c), std::move(msg)};
}

/// The error for an allocation that failed (std::bad_alloc caught):
/// too_large, "`what` (`bytes` bytes)", built inside so that a second
/// failure while building it leaves the short "out of memory" (which needs
/// no allocation of its own) instead of an exception.
error allocation_error(const char* what, std::uint64_t bytes) noexcept;

/// Bytes of an untrusted text (a key, a dtype name) that `quote` shows by
/// default.
inline constexpr std::size_t quote_max_bytes = 64;

/// `text` as it goes into a message or onto a terminal, one line that can
/// change nothing on the screen: in single quotes, with `\` and `'`
/// escaped as `\\` and `\'`; newline, tab and carriage return as `\n`,
/// `\t`, `\r`; other control characters (C0 and DEL) and bytes that are
/// not part of valid UTF-8 as `\xHH`; the C1 controls (U+0080..U+009F) and
/// the bidirectional overrides and isolates (U+202A..U+202E,
/// U+2066..U+2069) as `\uHHHH`. Other UTF-8 is kept as it is. At most
/// `max_bytes` bytes of `text` are shown (never half a character); a
/// longer text gets "..." after the closing quote.
///
///   quote("a\x1b[2Jb")   // "'a\\x1b[2Jb'"
///
/// Every message that names a key or another string from the bytes goes
/// through this function (the library's errors, the CLI, the examples).
std::string quote(std::string_view text, std::size_t max_bytes = quote_max_bytes);

/// `text` escaped as quote() escapes it, without the quotes and so
/// without escaping `'` and `\` (they only matter inside quotes: a reason
/// that quotes a key, as the library's own errors do, reads as written):
/// for a line that prints a peer's own words after a colon (a blob_abort
/// or close reason), so a reason can change nothing on the screen and
/// cannot start a line of its own ("...\nOK: every sample arrived" stays
/// on its line). At most `max_bytes` bytes of `text` are shown; a longer
/// text gets "...".
///
///   escape("gone\nOK: fine")   // "gone\\nOK: fine"
///   escape("entry 'x': too long")   // unchanged
std::string escape(std::string_view text, std::size_t max_bytes = SIZE_MAX);

}  // namespace blobpipe

template <>
struct std::is_error_code_enum<blobpipe::errc> : std::true_type {};
