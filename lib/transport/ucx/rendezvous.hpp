// The UCX rendezvous: how ucx::listen / ucx::connect set up a connection
// over a TCP socket of blobpipe's own, instead of UCX's sockaddr connection
// manager (whose listener UCX 1.13.1 let sixteen stray bytes abort the
// process with: tcp_sockcm_ep.c:825; docs/ucx.md "Connecting").
//
// Every message is a 16-byte header and a body:
//
//   magic "bpucxrv\0" (8) | version u16 = 1 | type u8 | flags u8 | body length u32
//
// (little endian). The connecting side (C) and the listening side (L):
//
//   C -> L  hello     C's worker address (ucp_worker_get_address)
//   L -> C  hello     loopback key u64 | nonce (16) | L's worker address
//   C -> L  claim     sn u32: C created its endpoint to L's address as the
//                     sn-th toward L (pairing.hpp)
//   L -> C  created   L created its endpoint to C's address as the sn-th
//                     toward C (skipping numbers when behind), so UCX pairs
//                     the two; or
//   L -> C  retry     L is past sn already: C drops its endpoint, claims again
//   C       am_verify on its endpoint, header = the nonce, once UCX has
//                     connected it (ucp_ep_flush_nbx)
//   L -> C  accepted  the nonce came on L's endpoint: the two paired
//
// On the same worker (C's address is L's own) L creates both endpoints
// (numbers 2k and 2k+1 pair there), parks C's under the loopback key it
// sends in its hello (flag loopback), and C takes it; no claim. Every
// header is checked before its body is read (magic, version, type, flags,
// length within the type's bounds); anything else, or silence past the
// handshake timeout, closes the socket: nothing from it reaches UCX before
// a valid hello. After `accepted` the socket stays open, unused, as the
// connection's link: its end before the peer's goodbye is a peer failure
// (connection::attach_link).
//
// Source: docs/ucx.md "Connecting"; UCX examples/ucp_hello_world.c (worker
// addresses exchanged over a socket).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include <asio/awaitable.hpp>
#include <asio/ip/tcp.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/transport/transport.hpp"
#include "lib/runtime/deadline.hpp"
#include "lib/transport/ucx/runtime.hpp"

namespace blobpipe::ucx::detail {

inline constexpr std::array<std::byte, 8> rv_magic = {
    std::byte{'b'}, std::byte{'p'}, std::byte{'u'}, std::byte{'c'},
    std::byte{'x'}, std::byte{'r'}, std::byte{'v'}, std::byte{0}};
inline constexpr std::uint16_t rv_version = 1;
inline constexpr std::size_t rv_header_bytes = 16;
/// The listener's hello: on the same worker, C's endpoint is parked.
inline constexpr std::uint8_t rv_flag_loopback = 0x01;
/// How often a connecting side claims a number before giving up.
inline constexpr int rv_max_claims = 8;

enum class rv_type : std::uint8_t { hello = 1, claim = 2, created = 3, retry = 4, accepted = 5 };

/// A set of types (bits 1 << type).
using rv_types = unsigned;
constexpr rv_types rv_types_of(rv_type t) noexcept { return 1u << static_cast<unsigned>(t); }

struct rv_header {
  rv_type type = rv_type::hello;
  std::uint8_t flags = 0;
  std::uint32_t length = 0;  ///< body bytes
};

std::array<std::byte, rv_header_bytes> encode_rv_header(rv_type t, std::uint8_t flags,
                                                        std::uint32_t length) noexcept;

/// Checks a header from the peer, in order: magic, version, type (in
/// `allowed`, a set of rv_types_of), flags (rv_flag_loopback only, in the listener's hello),
/// body length (hello: an address of 1 to pairing::max_address_bytes, after
/// 24 bytes of key and nonce from the listener; claim: 4; the rest: 0).
/// Errors: protocol_violation (the message names the first failing check).
result<rv_header> decode_rv_header(std::span<const std::byte, rv_header_bytes> b,
                                   rv_types allowed, bool from_listener);

/// One rendezvous in progress, shared with its deadline: when the deadline
/// passes, or the listener closes, abort() closes the socket and the
/// connection made so far, which ends every wait of the rendezvous.
struct rv_attempt : std::enable_shared_from_this<rv_attempt> {
  explicit rv_attempt(const asio::any_io_executor& ex) : sock(ex) {}
  /// Calls abort(true) after `t` (0: never).
  void arm(std::chrono::milliseconds t);
  void abort(bool timeout) noexcept;
  /// What a failed socket operation or wait means now: timed_out, closed
  /// (aborted), else `otherwise`.
  std::error_code failure(errc otherwise) const noexcept;

  asio::ip::tcp::socket sock;
  std::optional<blobpipe::detail::deadline> bound;  ///< arm()'s; reset once paired
  std::shared_ptr<connection> conn;  ///< this side's connection, once created
  std::shared_ptr<runtime> rt;       ///< set by the listening side (loopback clean-up)
  std::uint64_t parked = 0;          ///< listening side, loopback: the key of C's
  bool timed_out = false;
  bool aborted = false;
  bool reclaimed = false;  ///< listening side: closed to make room (counted out already)
  std::string why;  ///< one line on the failure
};

/// The listening side, on an accepted socket (a->sock). Returns the
/// connection, paired and verified, with the socket as its link.
/// Errors: protocol_violation (the bytes are not a rendezvous),
/// timed_out, closed (aborted), peer_failed (the peer went, or UCX
/// refused); a->why says more.
asio::awaitable<std::tuple<std::error_code, std::shared_ptr<connection>>> serve_rendezvous(
    std::shared_ptr<runtime> rt, std::shared_ptr<rv_attempt> a);

/// The connecting side, on a connected socket (a->sock). Errors as
/// serve_rendezvous.
asio::awaitable<std::tuple<std::error_code, std::shared_ptr<connection>>> join_rendezvous(
    std::shared_ptr<runtime> rt, std::shared_ptr<rv_attempt> a, transport_options opt);

}  // namespace blobpipe::ucx::detail
