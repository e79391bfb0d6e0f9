#include "blobpipe/errors.hpp"

#include <algorithm>
#include <new>

namespace blobpipe {
namespace {

class blobpipe_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "blobpipe"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::too_small: return "blob too small for a footer";
      case errc::bad_footer: return "bad blob magic or unsupported blob version";
      case errc::index_out_of_range: return "index range outside the blob";
      case errc::malformed_index: return "malformed index";
      case errc::entry_out_of_range: return "entry range outside the data region";
      case errc::shape_mismatch: return "shape x itemsize does not match entry length";
      case errc::unknown_kind: return "unknown entry kind";
      case errc::unknown_dtype: return "unknown dtype";
      case errc::too_large: return "blob too large for a v3 footer";
      case errc::buffer_too_small: return "output buffer too small";
      case errc::invalid_argument: return "invalid argument";
      case errc::closed: return "closed";
      case errc::peer_closed: return "peer closed the connection";
      case errc::peer_failed: return "peer failed";
      case errc::protocol_violation: return "protocol violation";
      case errc::timed_out: return "timed out";
      case errc::aborted: return "blob aborted by its producer";
      case errc::cuda_failure: return "CUDA call failed";
      case errc::io: return "file I/O failed";
    }
    return "unknown blobpipe error";
  }
};

}  // namespace

const std::error_category& category() noexcept {
  static const blobpipe_category c;
  return c;
}

const char* errc_name(errc e) noexcept {
  switch (e) {
    case errc::too_small: return "too_small";
    case errc::bad_footer: return "bad_footer";
    case errc::index_out_of_range: return "index_out_of_range";
    case errc::malformed_index: return "malformed_index";
    case errc::entry_out_of_range: return "entry_out_of_range";
    case errc::shape_mismatch: return "shape_mismatch";
    case errc::unknown_kind: return "unknown_kind";
    case errc::unknown_dtype: return "unknown_dtype";
    case errc::too_large: return "too_large";
    case errc::buffer_too_small: return "buffer_too_small";
    case errc::invalid_argument: return "invalid_argument";
    case errc::closed: return "closed";
    case errc::peer_closed: return "peer_closed";
    case errc::peer_failed: return "peer_failed";
    case errc::protocol_violation: return "protocol_violation";
    case errc::timed_out: return "timed_out";
    case errc::aborted: return "aborted";
    case errc::cuda_failure: return "cuda_failure";
    case errc::io: return "io";
  }
  return "unknown";
}

const char* errc_name(std::error_code ec) noexcept {
  if (ec.category() != category()) return "unknown";
  return errc_name(static_cast<errc>(ec.value()));
}

error allocation_error(const char* what, std::uint64_t bytes) noexcept {
  try {
    return make_error(errc::too_large,
                      std::string(what) + " (" + std::to_string(bytes) + " bytes)");
  } catch (const std::bad_alloc&) {
    static_assert(sizeof("out of memory") <= 16, "fits std::string's inline buffer");
    return error{make_error_code(errc::too_large), "out of memory"};
  }
}

namespace {

// Length of the well-formed UTF-8 sequence at the start of `s` (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF) and its code
// point; 0 when there is none.
std::size_t utf8_sequence(std::string_view s, char32_t& cp) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  std::size_t n;
  char32_t min;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2, cp = c & 0x1f, min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3, cp = c & 0x0f, min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (std::size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (b(i) & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

// Characters a terminal acts on rather than shows.
bool is_unicode_control(char32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

// Appends `text`, escaped as quote() says, to `out`: at most `max_bytes`
// bytes of it. Returns how many bytes of `text` it took.
std::size_t escape_into(std::string& out, std::string_view text, std::size_t max_bytes,
                        bool quoted) {
  static constexpr char hex[] = "0123456789abcdef";
  out.reserve(out.size() + std::min(text.size(), max_bytes) + 2);
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    char32_t cp = c;
    const std::size_t n = c < 0x80 ? 1 : utf8_sequence(text.substr(i), cp);
    const std::size_t len = std::max<std::size_t>(n, 1);  // a lone bad byte: 1
    if (i + len > max_bytes) break;
    if (quoted && (c == '\\' || c == '\'')) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (n == 0 || c < 0x20 || c == 0x7f) {  // not UTF-8, or a C0 control
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else if (is_unicode_control(cp)) {
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += hex[(cp >> shift) & 15];
    } else {
      out.append(text.substr(i, n));
    }
    i += len;
  }
  return i;
}

}  // namespace

std::string quote(std::string_view text, std::size_t max_bytes) {
  std::string out = "'";
  const std::size_t taken = escape_into(out, text, max_bytes, true);
  out += '\'';
  if (taken < text.size()) out += "...";
  return out;
}

std::string escape(std::string_view text, std::size_t max_bytes) {
  std::string out;
  if (escape_into(out, text, max_bytes, false) < text.size()) out += "...";
  return out;
}

}  // namespace blobpipe
