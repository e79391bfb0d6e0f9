// blobpipe/protocol/wire.hpp — the frame codec of the streaming wire protocol.
//
// Every message on a blobpipe connection is a frame: a fixed 24-byte
// little-endian header, then `length` payload bytes.
//
//   off size field
//     0    1 type       frame_type
//     1    1 flags      per type (entry_begin: frame_flag_inline,
//                       frame_flag_timestamp, frame_flag_compact;
//                       blob_begin: frame_flag_group;
//                       ack: frame_flag_credit_request); any other bit is a
//                       violation, and so is a flag whose feature was not
//                       negotiated
//     2    2 reserved   0
//     4    4 length     payload bytes that follow the header
//     8    8 blob_id    stream-unique blob number (0 for connection frames)
//    16    8 arg        per type: see frame_type
//
// The header is decoded and checked (known type, known flags, zero
// reserved, length <= max_frame_bytes) before a single payload byte is
// used, so a length from the wire is never used to allocate unchecked.
// What each frame means, and the per-type limits the receiver enforces,
// are in docs/wire.md ("Frames", "Limits"). This header knows nothing of
// sockets: payloads are bytes here, and the push decoder
// (blobpipe/protocol/decoder.hpp) and the framer (framer.hpp) build on it.
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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "blobpipe/errors.hpp"
#include "blobpipe/format/dtype.hpp"

namespace blobpipe {

/// Wire protocol version carried by the handshake (docs/wire.md "Handshake").
/// 3: entries up to the inline threshold travel inside their entry_begin,
/// the hello carries feature bits and extensions (room for what later
/// releases add without another version), and window credit counts keys,
/// meta and per-entry bookkeeping. 2 added resend sessions. A peer of
/// another version is refused with a message naming both.
inline constexpr std::uint16_t WIRE_VERSION = 3;
/// Handshake magic, "BPWP" in ASCII on the wire (little-endian u32).
inline constexpr std::uint32_t WIRE_MAGIC = 0x50575042;

inline constexpr std::size_t frame_header_size = 24;      ///< bytes
/// Fixed part of the hello payload, bytes; extensions may follow.
inline constexpr std::size_t hello_size = 64;
/// Largest hello payload (fixed part + extensions), bytes.
inline constexpr std::size_t max_hello_bytes = 4096;
inline constexpr std::uint32_t default_chunk_bytes = 1u << 20;       ///< 1 MiB
inline constexpr std::uint32_t min_chunk_bytes = 64;                  ///< bytes
inline constexpr std::uint32_t default_max_frame_bytes = 1u << 30;   ///< 1 GiB cap
inline constexpr std::uint32_t default_max_key_bytes = 64u << 10;    ///< 64 KiB
inline constexpr std::uint32_t default_max_meta_bytes = 4u << 10;    ///< 4 KiB
inline constexpr std::uint32_t max_reason_bytes = 4u << 10;          ///< abort/close text
/// Entries shorter than this travel inside their entry_begin (the sender's
/// copy threshold; the consumer may lower it in its hello), bytes.
inline constexpr std::uint32_t default_inline_bytes = 64u << 10;     ///< 64 KiB
/// Largest inline threshold either side may announce, bytes.
inline constexpr std::uint32_t max_inline_bytes = 1u << 20;          ///< 1 MiB

/// Window credit of an entry's bookkeeping, bytes (docs/wire.md "Flow
/// control"): the consumer holds the entry's object, its row and view until
/// the application drops it. An entry costs len + key + meta +
/// entry_overhead_bytes, released all at once then.
inline constexpr std::uint64_t entry_overhead_bytes = 256;

/// Window credit of an entry (see entry_overhead_bytes), bytes.
constexpr std::uint64_t entry_credit(std::uint64_t len, std::uint64_t key_bytes,
                                     std::uint64_t meta_bytes) noexcept {
  return len + key_bytes + meta_bytes + entry_overhead_bytes;
}

/// Frame types (docs/wire.md "Frames"). Direction: S = sender -> consumer,
/// C = consumer -> sender.
enum class frame_type : std::uint8_t {
  hello = 1,        ///< both; first frame each way. payload: hello (64 bytes + extensions)
  blob_begin = 2,   ///< S; payload: the blob's 16-byte tag (+ its group, frame_flag_group).
                    ///< blob_id > every earlier id
  entry_begin = 3,  ///< S; arg: entry index in the blob. payload: entry_begin payload
  data = 4,         ///< S; arg: offset of payload[0] from blob start. payload: entry bytes
  tail = 5,         ///< S; payload: exactly the write_tail bytes (index + v3 footer)
  blob_abort = 6,   ///< S; payload: UTF-8 reason (<= max_reason_bytes)
  ack = 7,          ///< C; arg: window credit returned (feature_credit_grants:
                    ///< granted), bytes; blob_id: 0, or a blob delivered (resend
                    ///< sessions only). no payload. S, with frame_flag_credit_request
                    ///< only: a credit request
  close = 8,        ///< both; orderly end. payload: UTF-8 reason (may be empty)
};

/// entry_begin flag: the entry's bytes follow its meta inside this frame.
inline constexpr std::uint8_t frame_flag_inline = 0x01;

/// True for the eight types above.
constexpr bool is_known_frame_type(std::uint8_t t) noexcept { return t >= 1 && t <= 8; }

/// Short lowercase name of a type ("entry_begin"); "unknown" otherwise.
const char* frame_type_name(frame_type t) noexcept;

/// A decoded frame header.
struct frame_header {
  frame_type type = frame_type::close;
  std::uint8_t flags = 0;      ///< per type (frame_flag_*)
  std::uint32_t length = 0;    ///< payload bytes
  std::uint64_t blob_id = 0;
  std::uint64_t arg = 0;       ///< per-type argument (see frame_type)
  friend bool operator==(const frame_header&, const frame_header&) = default;
};

/// Writes `h` as frame_header_size bytes (reserved zero).
/// REQUIRES: out.size() >= frame_header_size.
void encode_frame_header(const frame_header& h, std::span<std::byte> out) noexcept;

/// Decodes and checks a header: type known, flags known for the type,
/// reserved zero, length <= max_frame_bytes. Nothing about the blob is
/// checked here. Errors: too_small (fewer than frame_header_size bytes),
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

/// Optional protocol features (docs/wire.md "Features"). The sender offers
/// the ones it can use; the consumer answers with the subset it accepts;
/// an answer naming a feature that was not offered is a violation. Bits
/// this release does not know are never accepted. The bits are reserved
/// for what releases add without a new version (bit 3: a UCX
/// worker-address rendezvous, not defined yet); frames of a feature not accepted by both
/// sides are violations. docs/wire_features.md has the frame layouts.
///
/// Bit 0: entry_begin may carry the sender's monotonic clock
/// (frame_flag_timestamp), for emit -> entry_ready latency.
inline constexpr std::uint64_t feature_entry_timestamps = 1u << 0;
/// Bit 1: blob_begin may name the blob's group (frame_flag_group).
inline constexpr std::uint64_t feature_blob_groups = 1u << 1;
/// Bit 2: credit comes from a pool the consumer shares with other
/// connections: its hello's window is an initial grant (may be 0), an ack
/// grants credit (any amount, not only what was released), no item is
/// admitted beyond the credit granted, and the sender asks for credit it
/// waits for (an ack frame from the sender with frame_flag_credit_request).
inline constexpr std::uint64_t feature_credit_grants = 1u << 2;
/// Bit 4: entry_begin may carry the entry's row in a fixed binary form
/// (frame_flag_compact) instead of the msgpack meta map: no msgpack is
/// packed or parsed per entry. Entries whose dtype has no code
/// (compact_dtype_code) still go in the msgpack form on such a connection.
inline constexpr std::uint64_t feature_compact_entries = 1u << 4;
inline constexpr std::uint64_t known_features = feature_entry_timestamps | feature_blob_groups |
                                                feature_credit_grants | feature_compact_entries;

/// blob_begin flag (feature_blob_groups): the tag is followed by the group
/// (blob_group_bytes; encode_blob_group).
inline constexpr std::uint8_t frame_flag_group = 0x01;
/// ack flag (feature_credit_grants), sender to consumer only: a credit
/// request. arg: the credit, bytes, the sender's waiting items need in
/// all (its allowance is not enough for them); blob_id 0, no payload.
inline constexpr std::uint8_t frame_flag_credit_request = 0x02;
/// entry_begin flag (feature_entry_timestamps): the payload starts with a
/// u64, the sender's monotonic clock in nanoseconds when the entry was
/// emitted (steady_clock; comparable only within one host), before
/// key_len. Its 8 bytes are not counted in the entry's credit.
inline constexpr std::uint8_t frame_flag_timestamp = 0x04;
inline constexpr std::size_t timestamp_bytes = 8;
/// entry_begin flag (feature_compact_entries): the payload after the
/// timestamp is the compact form (encode_compact_entry_begin_prefix), not
/// key_len | meta_len | key | meta.
inline constexpr std::uint8_t frame_flag_compact = 0x08;
/// Writes / reads the u64 of frame_flag_timestamp (little-endian).
/// REQUIRES: at least timestamp_bytes bytes.
void encode_timestamp(std::uint64_t ns, std::span<std::byte> out) noexcept;
std::uint64_t decode_timestamp(std::span<const std::byte> in) noexcept;

/// A blob's group (feature_blob_groups): `size` blobs, possibly from
/// several senders on several connections, that the consumer's
/// application wants together (a GRPO group of samples).
struct blob_group {
  std::uint64_t id = 0;    ///< chosen by the application, the same for every member
  std::uint32_t size = 0;  ///< members, >= 1, the same for every member
  friend bool operator==(const blob_group&, const blob_group&) = default;
};
/// Bytes a group takes after blob_begin's tag: u64 id | u32 size | u32 reserved (0).
inline constexpr std::size_t blob_group_bytes = 16;
/// Writes `g` (blob_group_bytes). REQUIRES: out.size() >= blob_group_bytes.
void encode_blob_group(const blob_group& g, std::span<std::byte> out) noexcept;
/// Reads and checks a group (exactly blob_group_bytes): size >= 1,
/// reserved zero. Errors: protocol_violation.
[[nodiscard]] result<blob_group> decode_blob_group(std::span<const std::byte> in);

/// One hello extension: a type-length-value record after the fixed part
/// (u16 type | u16 length | value). Unknown types are skipped.
struct hello_extension {
  std::uint16_t type = 0;
  std::vector<std::byte> value;  ///< at most max_hello_bytes - hello_size - 4 bytes
  friend bool operator==(const hello_extension&, const hello_extension&) = default;
};

/// The handshake payload (docs/wire.md "Handshake"), little-endian:
///   u32 magic WIRE_MAGIC | u16 version | u16 role | u32 max_chunk_bytes |
///   u32 max_key_bytes | u64 window_bytes | u32 max_meta_bytes |
///   u32 dedup_window | 16 bytes session | u64 features |
///   u32 inline_bytes | u16 extension_bytes | u16 reserved (0) |
///   extensions (extension_bytes)
/// The sender proposes max_chunk_bytes and inline_bytes, offers features
/// and names its session; the consumer answers with the negotiated
/// min(proposal, its own) for both, its window and limits, how many
/// delivered blobs it remembers per session, the features it accepts, and
/// the session echoed.
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
  std::uint64_t features = 0;  ///< sender: offered; consumer: accepted (a subset)
  /// Entries shorter than this go inline in entry_begin, bytes. Sender:
  /// its copy threshold; consumer: the negotiated min(offer, its own).
  std::uint32_t inline_bytes = default_inline_bytes;
  std::vector<hello_extension> extensions{};
  friend bool operator==(const hello&, const hello&) = default;
};

/// Serialises `h` (hello_size bytes + its extensions).
/// REQUIRES: the extensions fit max_hello_bytes.
std::vector<std::byte> encode_hello(const hello& h);

/// Parses and checks a hello: magic, version == WIRE_VERSION (checked
/// before the size, so a peer of another version is named as such),
/// hello_size <= size <= max_hello_bytes, extension bytes filling the rest
/// exactly in whole records, reserved zero, known role,
/// max_chunk_bytes >= min_chunk_bytes, inline_bytes <= max_inline_bytes.
/// Errors: protocol_violation.
[[nodiscard]] result<hello> decode_hello(std::span<const std::byte> payload);

/// Hello extension types (docs/wire.md "Hello extensions"). A side skips
/// a type it does not know, so an extension needs no feature bit: an
/// older peer reads the hello as before.
///
/// Type 1, in the consumer's answer: the longest entry (its len, bytes) the
/// consumer admits, as a u64 little-endian (exactly
/// hello_ext_max_entry_bytes_size bytes). The sender refuses a longer entry
/// before framing any of it, rather than having the consumer refuse it
/// mid-stream and close. Without it the sender knows no such limit.
inline constexpr std::uint16_t hello_ext_max_entry_bytes = 1;
inline constexpr std::size_t hello_ext_max_entry_bytes_size = 8;  ///< bytes

/// The type-1 extension announcing `max_entry_bytes` (bytes).
hello_extension max_entry_bytes_extension(std::uint64_t max_entry_bytes);

/// The consumer's max_entry_bytes from `h`'s extensions (the first type-1
/// record), bytes; nullopt when it sent none.
/// Errors: protocol_violation (a value that is not exactly
/// hello_ext_max_entry_bytes_size bytes; the message names the extension
/// and its length).
[[nodiscard]] result<std::optional<std::uint64_t>> read_max_entry_bytes(const hello& h);

/// The entry_begin payload: u32 key_len | u32 meta_len | key (UTF-8) |
/// meta | with frame_flag_inline, exactly the entry's len bytes. `meta` is
/// Entry::meta() (msgpack map {o, n, k, d, s}). Bytes are opaque at this
/// layer; the decoder parses `meta`.
struct entry_begin_view {
  std::string_view key;
  std::span<const std::byte> meta;
  std::span<const std::byte> inline_bytes;  ///< empty unless frame_flag_inline
};

/// Bytes of an entry_begin payload before the inline bytes.
constexpr std::size_t entry_begin_prefix_bytes(std::size_t key_bytes,
                                               std::size_t meta_bytes) noexcept {
  return 8 + key_bytes + meta_bytes;
}

/// Writes the u32 key_len | u32 meta_len | key | meta prefix of an
/// entry_begin payload into `out` (entry_begin_prefix_bytes long).
void encode_entry_begin_prefix(std::string_view key, std::span<const std::byte> meta,
                               std::span<std::byte> out) noexcept;

/// Builds a whole entry_begin payload (prefix, then `inline_bytes`).
std::vector<std::byte> encode_entry_begin(std::string_view key, std::span<const std::byte> meta,
                                          std::span<const std::byte> inline_bytes = {});

/// Splits an entry_begin payload (views into `payload`), checking
/// key_len <= max_key_bytes, 1 <= meta_len <= max_meta_bytes, prefix inside
/// the payload, and the rest empty unless `has_inline` (then it is the
/// inline bytes; their count is checked against the meta by the decoder).
/// Errors: protocol_violation.
[[nodiscard]] result<entry_begin_view> decode_entry_begin(std::span<const std::byte> payload,
                                                          bool has_inline,
                                                          std::uint32_t max_key_bytes,
                                                          std::uint32_t max_meta_bytes);

// ---- the compact entry_begin (feature_compact_entries) ----------------------

/// One dtype of the compact form's fixed table (docs/wire.md "Compact
/// entries"): code 0 is a pickle's missing dtype; 1 to 25 are the torch
/// names the reference writes (kind 't', parse_torch_dtype's canonical
/// spellings); 64 to 88 are fixed-size numpy dtype.str values (kind 'n':
/// |b1 |i1 |u1, then i2 i4 i8 u2 u4 u8 f2 f4 f8 c8 c16 little-endian
/// ('<') and big-endian ('>')). Every other code is reserved.
struct compact_dtype {
  std::uint8_t code = 0;
  char kind = 0;          ///< 't' or 'n'
  std::string_view name;  ///< exactly as the index row spells it
};

/// The table entry of `code`, or null for code 0 and the reserved codes.
const compact_dtype* compact_dtype_of(std::uint8_t code) noexcept;
/// The format's dtype of table entry `d`: parse_dtype(d.kind, d.name),
/// parsed once and valid for the program's life, so a compact row is
/// checked and viewed without a lookup by name (decoder,
/// entry_announcement::type). REQUIRES: d.code is a code of the table
/// (compact_dtype_of(d.code) is not null).
const dtype& format_dtype_of(const compact_dtype& d);
/// The code of dtype `name` for entry kind `kind`, or 0 when it has none
/// (only exact spellings: "float32" has one, its alias "float" does not,
/// so the row the consumer rebuilds is the row the sender wrote).
std::uint8_t compact_dtype_code(char kind, std::string_view name) noexcept;

/// Compact entry_begin payload, after the timestamp (frame_flag_compact):
///   u32 key_len | u8 kind | u8 dtype code | u16 ndim | u64 len |
///   ndim x i64 dims | key | with frame_flag_inline, the len bytes.
/// The entry's offset is not sent: it is the aligned end of the previous
/// entry, which the decoder requires of every entry. Little-endian.
inline constexpr std::size_t compact_fixed_bytes = 16;  ///< key_len to len, bytes
/// The compact form's meta bytes (kind, code, ndim, len, dims), bytes:
/// what an entry's credit counts and max_meta_bytes bounds, as meta_len
/// does in the msgpack form (key_len is not counted, as neither length
/// of the msgpack form is).
constexpr std::uint64_t compact_meta_bytes(std::uint64_t ndim) noexcept {
  return compact_fixed_bytes - 4 + 8 * ndim;
}
/// Window credit of a compact entry (docs/wire.md "Flow control"), bytes:
/// entry_credit with its compact meta bytes. Sender and consumer both
/// charge this.
constexpr std::uint64_t compact_entry_credit(std::uint64_t len, std::uint64_t key_bytes,
                                             std::uint64_t ndim) noexcept {
  return entry_credit(len, key_bytes, compact_meta_bytes(ndim));
}
/// Most dims a compact entry may have (torch's limit, as max_dims).
inline constexpr std::uint64_t compact_max_dims = 64;
/// Whether a compact entry of `ndim` dims is allowed: at most
/// compact_max_dims, and its compact meta bytes within the consumer's
/// max_meta_bytes (which thus bounds ndim, as it bounds meta_len).
constexpr bool compact_dims_fit(std::uint64_t ndim, std::uint32_t max_meta_bytes) noexcept {
  return ndim <= compact_max_dims && compact_meta_bytes(ndim) <= max_meta_bytes;
}

/// Bytes of a compact entry_begin payload before the inline bytes.
constexpr std::size_t compact_entry_begin_prefix_bytes(std::size_t key_bytes,
                                                       std::size_t ndim) noexcept {
  return compact_fixed_bytes + 8 * ndim + key_bytes;
}

/// A compact entry_begin's fields (views into its payload).
struct compact_entry_view {
  std::string_view key;
  char kind = 'p';
  const compact_dtype* dtype = nullptr;     ///< null for a pickle (code 0)
  std::uint64_t len = 0;                    ///< bytes
  std::uint16_t ndim = 0;
  std::span<const std::byte> dims;          ///< ndim x i64, little-endian, each in [0, 2^62]
  std::span<const std::byte> inline_bytes;  ///< empty unless frame_flag_inline
  /// Dim `i` (REQUIRES: i < ndim).
  std::int64_t dim(std::size_t i) const noexcept;
};

/// Writes the compact prefix (compact_entry_begin_prefix_bytes long) into
/// `out`. REQUIRES: `code` is kind's (or 0 for a pickle), dims.size() fits
/// a u16.
void encode_compact_entry_begin_prefix(std::string_view key, char kind, std::uint8_t code,
                                       std::uint64_t len, std::span<const std::int64_t> dims,
                                       std::span<std::byte> out) noexcept;

/// Builds a whole compact entry_begin payload (prefix, then `inline_bytes`).
std::vector<std::byte> encode_compact_entry_begin(std::string_view key, char kind,
                                                  std::uint8_t code, std::uint64_t len,
                                                  std::span<const std::int64_t> dims,
                                                  std::span<const std::byte> inline_bytes = {});

/// Splits and checks a compact entry_begin payload, in this order: the 16
/// fixed bytes present; key_len <= max_key_bytes; kind 't', 'n' or 'p';
/// the dtype code assigned (compact_dtype_of), and of the entry's kind
/// (a pickle: code 0 and no dims; 't'/'n': a code of that kind);
/// compact_dims_fit(ndim, max_meta_bytes); dims and key inside the
/// payload; nothing after them unless `has_inline`; each dim in [0, 2^62].
/// Errors: protocol_violation, the message naming the field
/// ("entry_begin: compact dtype code 30 is reserved").
[[nodiscard]] result<compact_entry_view> decode_compact_entry_begin(
    std::span<const std::byte> payload, bool has_inline, std::uint32_t max_key_bytes,
    std::uint32_t max_meta_bytes);

}  // namespace blobpipe
