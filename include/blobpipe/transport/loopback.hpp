// blobpipe/transport/loopback.hpp — an in-process transport pair.
//
// Two connected ends, on one executor or on two (two threads, each running
// its own io_context). A write waits (rendezvous) until the other end has
// read its bytes: they are copied once, from the writer's buffers straight
// into the reader's buffer or destination (read_some, read_exact), as a
// socket would deliver them, with no staging copy and no system call.
// Closing either end wakes every pending operation on both ends: the
// closing end's operations fail with `closed`, the other end's with
// `peer_closed`.
//
//   asio::io_context ctx;
//   auto [a, b] = blobpipe::loopback::make_pair(ctx.get_executor());
//   // bytes a->write(...) are read by b->read_some(...) / read_exact(...)
//
// Source: docs/wire.md "Transport".
#pragma once

#include <memory>
#include <utility>

#include <asio/any_io_executor.hpp>

#include "blobpipe/transport/transport.hpp"

namespace blobpipe::loopback {

/// Two connected transports on one executor.
std::pair<std::unique_ptr<transport>, std::unique_ptr<transport>> make_pair(
    asio::any_io_executor ex, transport_options opt = {});

/// Two connected transports, the first on `ex_a`, the second on `ex_b`
/// (which may run on another thread).
std::pair<std::unique_ptr<transport>, std::unique_ptr<transport>> make_pair(
    asio::any_io_executor ex_a, asio::any_io_executor ex_b, transport_options opt = {});

}  // namespace blobpipe::loopback
