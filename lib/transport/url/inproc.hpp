// inproc:// endpoints (internal): named in-process listeners over the
// loopback transport (blobpipe/transport/loopback.hpp).
//
// A process-wide registry maps each name to its listener's hub. connect()
// makes a loopback pair, its first end on the connector's executor and the
// second on the listener's, and posts the second into the hub's backlog,
// where accept() takes it; like a kernel backlog, connect() completes
// before accept() is called. The registry is guarded by a mutex, so
// listener and connector may run on different threads; the hub's backlog
// is touched only on the listener's executor.
#pragma once

#include <memory>
#include <string>
#include <system_error>
#include <tuple>

#include <asio/any_io_executor.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/transport/transport.hpp"

namespace blobpipe::detail {

/// Registers `name`. Errors: peer_failed (a live listener has the name).
[[nodiscard]] result<std::unique_ptr<listener>> inproc_listen(asio::any_io_executor ex,
                                                              const std::string& name);

/// Connects to the listener registered as `name`; the transport lives on
/// `ex`. Errors: peer_failed (no listener has the name).
std::tuple<std::error_code, std::unique_ptr<transport>> inproc_connect(asio::any_io_executor ex,
                                                                       const std::string& name,
                                                                       transport_options opt);

}  // namespace blobpipe::detail
