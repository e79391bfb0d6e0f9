// Shared state of a sender and its blobs (internal). Coroutines hold it by
// shared_ptr, never by raw `this`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/pipeline/producer.hpp"
#include "blobpipe/transport/transport.hpp"
#include "lib/pipeline/watchdog.hpp"
#include "lib/transport/async_sync.hpp"

namespace blobpipe::detail {

struct resend_state;  // lib/pipeline/resend.hpp
struct kept_blob;

struct sender_state : std::enable_shared_from_this<sender_state> {
  sender_state(std::shared_ptr<transport> tr, asio::any_io_executor e, sender_options o);
  ~sender_state();

  /// Ends the sender with `ec` (the first error wins) and wakes every waiter.
  void fail(std::error_code ec) noexcept;

  // The current connection. A resend session replaces it after a failure
  // (a coroutine still using the old one holds its own shared_ptr).
  std::shared_ptr<transport> t;
  asio::any_io_executor ex;
  sender_options opt;
  std::uint32_t chunk_bytes = 0;     // negotiated
  std::uint64_t window_bytes = 0;    // the consumer's
  std::uint32_t max_key_bytes = 0;   // the consumer's
  std::uint32_t max_meta_bytes = 0;  // the consumer's
  std::uint64_t in_flight = 0;       // bytes sent, not yet acknowledged
  std::uint64_t next_blob_id = 1;
  std::uint64_t gen = 0;             // connection number (a resend session reconnects)
  std::error_code error;             // set once; every later call returns it
  std::string message;               // what broke, for protocol violations
  bool closing = false;              // shutdown() sent `close`
  bool reader_done = false;          // the ack reader has ended
  async_condition credit_cv;         // in_flight fell, or the connection ended
  async_condition reader_cv;         // reader_done became true
  sender_stats stats;
  watchdog dog;                      // opt.stall_timeout
  std::string timeout_reason;        // set when the watchdog fired
  std::unique_ptr<resend_state> rs;  // resend sessions only
};

struct blob_state {
  blob_state(std::shared_ptr<sender_state> s, std::uint64_t blob_id, const tag_t& t)
      : sender(std::move(s)), id(blob_id), tag(t), lock(sender->ex) {}
  ~blob_state();  // aborts a begun, unfinished blob

  std::shared_ptr<sender_state> sender;
  std::uint64_t id;
  tag_t tag;
  layout_builder builder;
  async_mutex lock;      // one emit/finish/abort at a time, in call order
  bool begun = false;    // blob_begin sent
  bool ended = false;    // tail or abort sent
  bool broken = false;   // an entry went out incompletely; only abort() is left
  std::shared_ptr<kept_blob> kept;  // resend session: the bytes kept for resending
  std::string last_error;  // why the last emit failed (blob_writer::last_error)
};

}  // namespace blobpipe::detail
