// Endpoints from worker addresses, numbered the way UCX 1.13 pairs them.
//
// Two workers that each create an endpoint to the other's address
// (ucp_ep_create with UCP_EP_PARAM_FIELD_REMOTE_ADDRESS) are connected to
// each other by UCX only if both endpoints carry the same connection
// sequence number: each worker counts the endpoints it has created toward
// each remote worker (ucp_ep_match_get_sn, per remote uuid, from 0), and
// the k-th endpoint one side creates pairs with the k-th the other side
// creates. Toward its own worker (loopback, with
// UCP_EP_PARAMS_FLAGS_NO_LOOPBACK) the one count pairs endpoints 2k and
// 2k+1. UCX's API does not say which number an endpoint got, so this class
// keeps the same count (UCX counts only in ucp_ep_create with a remote
// address, and in this worker only this class calls that), and the
// rendezvous (rendezvous.hpp) makes both ends agree on the number before
// the second end creates its endpoint. When one end is behind, it skips
// numbers with throwaway endpoints, closed at once.
//
// The count is 16 bits wide in UCX 1.13 (ucp_ep_match_conn_sn_t): past
// 65534 endpoints from one worker toward one remote worker, UCX stops
// pairing them, so create() refuses there (docs/ucx.md "Gaps").
//
//   pairing p(worker);
//   std::uint32_t sn = p.next(remote);        // agree on sn with the peer
//   p.skip_to(remote, agreed);                // when behind
//   auto ep = p.create(remote, params);       // gets `agreed`
//
// Source: UCX 1.13.1 src/ucp/core/ucp_ep.c ucp_ep_create_api_to_worker_addr,
// src/ucp/wireup/wireup.c ucp_wireup_process_request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>

#include <ucp/api/ucp.h>

#include "blobpipe/errors.hpp"

namespace blobpipe::ucx::detail {

class pairing {
 public:
  /// The last sequence number UCX 1.13 pairs (its count is a uint16_t and
  /// 65535 means "do not match").
  static constexpr std::uint32_t last_sn = 65534;
  /// Most bytes of a worker address taken from a peer.
  static constexpr std::size_t max_address_bytes = std::size_t{64} << 10;

  /// `own`: this worker's address (the format peers' must match).
  pairing(ucp_worker_h w, std::span<const std::byte> own) : worker_(w), own_(own) {}

  /// The number UCX gives the next endpoint this worker creates toward the
  /// worker at `remote` (its packed address).
  std::uint32_t next(std::span<const std::byte> remote) const;

  /// Creates and force-closes endpoints toward `remote` until next(remote)
  /// is `sn` (nothing when it is already). Each throwaway's wireup request
  /// pairs with whatever the peer holds under that number, or with nothing.
  /// REQUIRES: next(remote) <= sn <= last_sn.
  void skip_to(std::span<const std::byte> remote, std::uint32_t sn);

  /// Whether `remote` is a worker address of the format this worker packs
  /// (UCX 1.13: the low 4 bits of byte 0 are the address version, and
  /// ucp_address_unpack aborts the process on a version it does not know,
  /// ucs_assertv_always in ucp_address_unpack_header). UCX checks nothing
  /// else it could fail on cleanly; this is the one test cheap enough to
  /// make first (docs/ucx.md "Foreign bytes").
  bool same_format(std::span<const std::byte> remote) const noexcept;

  /// ucp_ep_create toward `remote` with `p` (this adds the remote address
  /// and UCP_EP_PARAMS_FLAGS_NO_LOOPBACK). The address is copied into a
  /// zero-padded buffer first: UCX's unpacker is given no length and reads
  /// until its own end marks, so a malformed address from a peer runs into
  /// zeros of ours (which end the parse) instead of past the bytes it sent.
  /// Counts the endpoint whether or not UCX created it (UCX counts once the
  /// address has unpacked, before the steps that can fail after).
  /// Errors: peer_failed (UCX refused, e.g. no transport reaches the peer;
  /// the message names the status, or the 16-bit limit).
  result<ucp_ep_h> create(std::span<const std::byte> remote, ucp_ep_params_t p);

 private:
  static std::string key(std::span<const std::byte> remote) {
    return {reinterpret_cast<const char*>(remote.data()), remote.size()};
  }
  ucp_worker_h worker_;
  std::span<const std::byte> own_;
  std::unordered_map<std::string, std::uint32_t> next_;
};

}  // namespace blobpipe::ucx::detail
