// blobpipe/transport/loopback.hpp — an in-process transport pair.
//
// Two connected ends on one executor. A send waits (rendezvous) until the
// receiving end has taken the frame: the payload is copied once, from the
// sender's buffers straight into the destination given to
// receive_payload, like a socket would deliver it, with no staging copy.
// Closing either end wakes every pending operation on both ends: the
// closing end's operations fail with `closed`, the other end's with
// `peer_closed`.
//
//   asio::io_context ctx;
//   auto [a, b] = blobpipe::loopback::make_pair(ctx.get_executor());
//   // a->send(...) is received by b->receive_header() / receive_payload()
//
// Source: docs/wire.md "Transport".
#pragma once

#include <memory>
#include <utility>

#include <asio/any_io_executor.hpp>

#include "blobpipe/transport/transport.hpp"

namespace blobpipe::loopback {

/// Two connected transports. Header checks use `opt.max_frame_bytes` on
/// both ends (each header is encoded and decoded as on a real wire).
std::pair<std::unique_ptr<transport>, std::unique_ptr<transport>> make_pair(
    asio::any_io_executor ex, transport_options opt = {});

}  // namespace blobpipe::loopback
