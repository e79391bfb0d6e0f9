// blobpipe/protocol/wire.hpp — the frame codec of the streaming wire protocol.
//
// Every message on a blobpipe connection is a frame: a fixed 24-byte
// little-endian header, then `length` payload bytes.
//
//   off size field
//     0    1 type       frame_type
//     1    1 flags      0 (reserved; a non-zero value is a violation)
//     2    2 reserved   0
//     4    4 length     payload bytes that follow the header
//     8    8 blob_id    stream-unique blob number (0 for connection frames)
//    16    8 arg        per type: see frame_type
//
// The header is decoded and checked (known type, zero flags/reserved,
// length <= the transport's max_frame_bytes) before a single payload byte
// is read, so a length from the wire is never used to allocate unchecked.
// What each frame means, and the per-type limits the receiver enforces,
// are in docs/wire.md ("Frames", "Limits"). This header knows nothing of
// dtypes or msgpack: payloads are opaque bytes here.
//
//   std::array<std::byte, blobpipe::frame_header_size> buf;
//   blobpipe::encode_frame_header({.type = blobpipe::frame_type::ack, .arg = 4096}, buf);
//   auto h = blobpipe::decode_frame_header(buf, blobpipe::default_max_frame_bytes);
//
// Source: docs/wire.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blobpipe/errors.hpp"

namespace blobpipe {

/// Wire protocol version carried by the handshake (docs/wire.md "Handshake").
/// 2 added the resend session and delivery acknowledgements (docs/wire.md
/// "Delivery"); a version-1 peer is refused with a message naming both.
inline constexpr std::uint16_t WIRE_VERSION = 2;
/// Handshake magic, "BPWP" in ASCII on the wire (little-endian u32).
inline constexpr std::uint32_t WIRE_MAGIC = 0x50575042;

inline constexpr std::size_t frame_header_size = 24;      ///< bytes
inline constexpr std::size_t hello_size = 48;             ///< hello payload, bytes
inline constexpr std::uint32_t default_chunk_bytes = 1u << 20;       ///< 1 MiB
inline constexpr std::uint32_t min_chunk_bytes = 64;                  ///< bytes
inline constexpr std::uint32_t default_max_frame_bytes = 1u << 30;   ///< 1 GiB cap
inline constexpr std::uint32_t default_max_key_bytes = 64u << 10;    ///< 64 KiB
inline constexpr std::uint32_t default_max_meta_bytes = 4u << 10;    ///< 4 KiB
inline constexpr std::uint32_t max_reason_bytes = 4u << 10;          ///< abort/close text

/// Frame types (docs/wire.md "Frames"). Direction: S = sender -> consumer,
/// C = consumer -> sender.
enum class frame_type : std::uint8_t {
  hello = 1,        ///< both; first frame each way. payload: hello (32 bytes)
  blob_begin = 2,   ///< S; payload: the blob's 16-byte tag. blob_id > every earlier id
  entry_begin = 3,  ///< S; arg: entry index in the blob. payload: entry_begin_payload
  data = 4,         ///< S; arg: offset of payload[0] from blob start. payload: entry bytes
  tail = 5,         ///< S; payload: exactly the write_tail bytes (index + v3 footer)
  blob_abort = 6,   ///< S; payload: UTF-8 reason (<= max_reason_bytes)
  ack = 7,          ///< C; arg: window credit returned, bytes; blob_id: 0, or a
                    ///< blob delivered (resend sessions only). no payload
  close = 8,        ///< both; orderly end. payload: UTF-8 reason (may be empty)
};

/// True for the eight types above.
constexpr bool is_known_frame_type(std::uint8_t t) noexcept { return t >= 1 && t <= 8; }

/// Short lowercase name of a type ("entry_begin"); "unknown" otherwise.
const char* frame_type_name(frame_type t) noexcept;

/// A decoded frame header.
struct frame_header {
  frame_type type = frame_type::close;
  std::uint32_t length = 0;    ///< payload bytes
  std::uint64_t blob_id = 0;
  std::uint64_t arg = 0;       ///< per-type argument (see frame_type)
  friend bool operator==(const frame_header&, const frame_header&) = default;
};

/// Writes `h` as frame_header_size bytes (flags and reserved zero).
/// REQUIRES: out.size() >= frame_header_size.
void encode_frame_header(const frame_header& h, std::span<std::byte> out) noexcept;

/// Decodes and checks a header: type known, flags and reserved zero,
/// length <= max_frame_bytes. Nothing about the blob is checked here.
/// Errors: too_small (fewer than frame_header_size bytes),
/// protocol_violation (the message names the failing field).
[[nodiscard]] result<frame_header> decode_frame_header(std::span<const std::byte> in,
                                                       std::uint32_t max_frame_bytes);

/// Which end of a connection a hello comes from.
enum class wire_role : std::uint16_t { sender = 1, consumer = 2 };

/// A resend session: 16 random bytes a reconnecting sender keeps across
/// its connections, so the consumer can recognise blobs it already
/// delivered (docs/wire.md "Delivery"). All zero: no session.
using session_id = std::array<std::byte, 16>;
inline constexpr session_id NO_SESSION{};

/// The handshake payload (hello_size bytes, little-endian):
///   u32 magic WIRE_MAGIC | u16 version | u16 role | u32 max_chunk_bytes |
///   u32 max_key_bytes | u64 window_bytes | u32 max_meta_bytes |
///   u32 dedup_window | 16 bytes session
/// The sender proposes max_chunk_bytes and names its session; the consumer
/// answers with the negotiated min(proposal, its own), its window, how many
/// delivered blobs it remembers per session, and the session echoed.
/// docs/wire.md "Handshake".
struct hello {
  std::uint16_t version = WIRE_VERSION;
  wire_role role = wire_role::sender;
  std::uint32_t max_chunk_bytes = default_chunk_bytes;  ///< largest data payload, bytes
  std::uint32_t max_key_bytes = default_max_key_bytes;  ///< consumer's key limit, bytes
  std::uint64_t window_bytes = 0;   ///< consumer: its receive window, bytes; sender: 0
  std::uint32_t max_meta_bytes = default_max_meta_bytes;  ///< consumer's meta limit
  /// Consumer: blob tags it remembers per session (0: no de-duplication,
  /// so no resend session can be served). Sender: 0.
  std::uint32_t dedup_window = 0;
  /// Sender: its resend session, or NO_SESSION for a plain sender (no
  /// delivery acks). Consumer: the sender's session, echoed.
  session_id session = NO_SESSION;
  friend bool operator==(const hello&, const hello&) = default;
};

/// Serialises `h` (hello_size bytes).
std::vector<std::byte> encode_hello(const hello& h);

/// Parses and checks a hello: magic, version == WIRE_VERSION (checked
/// before the size, so an older peer is named as such), exact size, known
/// role, max_chunk_bytes >= min_chunk_bytes.
/// Errors: protocol_violation.
[[nodiscard]] result<hello> decode_hello(std::span<const std::byte> payload);

/// The entry_begin payload: u32 key_len | key (UTF-8) | meta, where meta
/// is Entry::meta() (msgpack map {o, n, k, d, s}) and fills the rest.
/// Bytes are opaque at this layer; the pipeline parses `meta`.
struct entry_begin_view {
  std::string_view key;
  std::span<const std::byte> meta;
};

/// Builds an entry_begin payload.
std::vector<std::byte> encode_entry_begin(std::string_view key,
                                          std::span<const std::byte> meta);

/// Splits an entry_begin payload (views into `payload`), checking
/// key_len <= max_key_bytes, 4 + key_len <= payload size, and
/// 1 <= meta size <= max_meta_bytes. Errors: protocol_violation.
[[nodiscard]] result<entry_begin_view> decode_entry_begin(std::span<const std::byte> payload,
                                                          std::uint32_t max_key_bytes,
                                                          std::uint32_t max_meta_bytes);

}  // namespace blobpipe
