// blobpipe/format/footer.hpp — the fixed-size footer that ends every NVDP blob.
//
// v3 (32 bytes, little-endian):
//   u32 magic 0x4E564450 ("PDVN" on disk) | u16 version 3 | u16 flags 0 |
//   u32 index_off | u32 index_len | 16-byte tag
// v2 (16 bytes) is the same without the tag; it is read, never written.
// A reader looks at the last 32 bytes for v3, then the last 16 for v2.
// Source: `blob_format` footer layout (Python reference); docs/wire.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "blobpipe/errors.hpp"

namespace blobpipe {

inline constexpr std::size_t ALIGN = 64;              ///< entry alignment, bytes
inline constexpr std::uint32_t MAGIC = 0x4E564450;    ///< "PDVN" little-endian
inline constexpr std::uint16_t VERSION = 3;           ///< version written
inline constexpr std::uint16_t VERSION_V2 = 2;        ///< legacy, read only
inline constexpr std::size_t FOOTER_SIZE = 32;        ///< v3 footer, bytes
inline constexpr std::size_t FOOTER_V2_SIZE = 16;     ///< v2 footer, bytes
inline constexpr std::size_t TAG_SIZE = 16;           ///< tag, bytes

/// A blob's 16-byte tag (the reference uses a uuid4 per blob).
using tag_t = std::array<std::byte, TAG_SIZE>;

/// The all-zero tag: "no tag".
inline constexpr tag_t NO_TAG{};

/// A decoded footer.
struct footer {
  std::uint16_t version = VERSION;  ///< 3, or 2 for a legacy blob
  std::uint16_t flags = 0;
  std::uint32_t index_off = 0;      ///< bytes from blob start
  std::uint32_t index_len = 0;      ///< bytes
  tag_t tag = NO_TAG;               ///< NO_TAG for v2

  /// Footer size in bytes for `version` (32 or 16).
  std::size_t size() const noexcept {
    return version == VERSION_V2 ? FOOTER_V2_SIZE : FOOTER_SIZE;
  }
  friend bool operator==(const footer&, const footer&) = default;
};

/// Serialises a v3 footer into exactly FOOTER_SIZE bytes at `out`.
/// REQUIRES: out.size() >= FOOTER_SIZE.
void encode_footer(const footer& f, std::span<std::byte> out) noexcept;

/// Reads the footer at the end of `blob` (the whole blob, or at least its
/// tail): v3 if the last 32 bytes hold magic and version 3, else v2 if the
/// last 16 hold magic and version 2.
/// Errors: too_small (fewer than 16 bytes), bad_footer.
[[nodiscard]] result<footer> read_footer(std::span<const std::byte> blob);

/// True when `tail` ends with a valid v3 or v2 footer.
/// Source: footer_is_valid (Python reference).
bool footer_is_valid(std::span<const std::byte> tail) noexcept;

/// The tag of the footer that ends `tail`; nullopt for an invalid footer,
/// a v2 footer, or NO_TAG. Source: footer_tag (Python reference).
std::optional<tag_t> footer_tag(std::span<const std::byte> tail) noexcept;

/// A tag from up to 16 bytes, zero-padded on the right (as the reference
/// pads a short tag). Errors: invalid_argument (more than 16 bytes).
[[nodiscard]] result<tag_t> make_tag(std::span<const std::byte> bytes);
[[nodiscard]] result<tag_t> make_tag(std::string_view text);

/// A random version-4 uuid as a tag (the default tag of a streamed blob).
tag_t random_tag();

/// Lowercase hex of a tag (32 characters).
std::string tag_hex(const tag_t& tag);

}  // namespace blobpipe
