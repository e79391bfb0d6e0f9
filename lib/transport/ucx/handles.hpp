// RAII for UCX handles: context -> worker -> endpoint.
//
// Each wrapper is move-only and releases its handle in its destructor.
// Owners declare them in acquisition order (context, worker, then what
// lives on the worker), so C++ destruction runs UCX's teardown in exact
// reverse: endpoints, then the worker (ucp_worker_destroy),
// then the context (ucp_cleanup).
//
//   auto ctx = context::create({{"TLS", "tcp"}}).value();
//   auto w = worker::create(ctx).value();
//
// Source: UCX examples/ucp_hello_world.c (main's labelled cleanup).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include <ucp/api/ucp.h>

#include "blobpipe/errors.hpp"

namespace blobpipe::ucx::detail {

/// The overrides ucp_config_modify applies: blobpipe's defaults (for peer
/// error mode MM_ERROR_HANDLING=y so posix/sysv qualify and
/// MEMORY_INVALIDATE=y so cma does; each
/// unless set in the environment or named in `overrides`), then `overrides`.
std::vector<std::pair<std::string, std::string>> effective_config(
    const std::vector<std::pair<std::string, std::string>>& overrides);

/// A ucp_context_h with the AM and WAKEUP features.
class context {
 public:
  /// ucp_config_read (environment), ucp_config_modify for each of
  /// effective_config(overrides) (names without "UCX_"), ucp_init.
  /// Errors: invalid_argument (ucp_config_modify rejected a name or value),
  /// peer_failed (ucp_config_read or ucp_init failed).
  static result<context> create(const std::vector<std::pair<std::string, std::string>>& config);

  context(context&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  context& operator=(context&& o) noexcept;
  ~context();
  ucp_context_h get() const noexcept { return h_; }

 private:
  explicit context(ucp_context_h h) : h_(h) {}
  ucp_context_h h_ = nullptr;
};

/// A single-threaded ucp_worker_h (UCS_THREAD_MODE_SINGLE: one io_context
/// thread drives it).
class worker {
 public:
  /// ucp_worker_create. Errors: peer_failed.
  static result<worker> create(const context& ctx);

  worker(worker&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  worker& operator=(worker&& o) noexcept;
  ~worker();
  ucp_worker_h get() const noexcept { return h_; }

  /// The worker's event fd (ucp_worker_get_efd); owned by the worker.
  /// Errors: peer_failed.
  result<int> event_fd() const;

  /// The worker's packed address (ucp_worker_get_address), copied.
  /// Errors: peer_failed.
  result<std::vector<std::byte>> address() const;

 private:
  explicit worker(ucp_worker_h h) : h_(h) {}
  ucp_worker_h h_ = nullptr;
};

/// A ucp_ep_h. The orderly close (flush, then ucp_ep_close_nbx) is
/// asynchronous and belongs to the connection that owns the endpoint: it
/// takes the handle out with release(). The destructor is the fallback for
/// an endpoint still held then: a forced ucp_ep_close_nbx whose request is
/// freed at once (UCX finishes it during later progress).
class endpoint {
 public:
  endpoint() = default;
  explicit endpoint(ucp_ep_h h) noexcept : h_(h) {}
  endpoint(endpoint&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  endpoint& operator=(endpoint&& o) noexcept;
  ~endpoint();
  ucp_ep_h get() const noexcept { return h_; }
  explicit operator bool() const noexcept { return h_ != nullptr; }
  /// Gives up ownership; the caller closes the handle.
  ucp_ep_h release() noexcept { return std::exchange(h_, nullptr); }

 private:
  ucp_ep_h h_ = nullptr;
};

}  // namespace blobpipe::ucx::detail
