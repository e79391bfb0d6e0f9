// Shared state of a sender and its blobs (internal). Coroutines hold it by
// shared_ptr, never by raw `this`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/layout.hpp"
#include "blobpipe/producer.hpp"
#include "blobpipe/transport.hpp"
#include "lib/transport/async_sync.hpp"

namespace blobpipe::detail {

struct sender_state {
  explicit sender_state(std::unique_ptr<transport> tr)
      : t(std::move(tr)), ex(t->get_executor()), credit_cv(ex), reader_cv(ex) {}

  /// Ends the connection with `ec` (the first error wins) and wakes every waiter.
  void fail(std::error_code ec) noexcept;

  std::unique_ptr<transport> t;
  asio::any_io_executor ex;
  std::uint32_t chunk_bytes = 0;     // negotiated
  std::uint64_t window_bytes = 0;    // the consumer's
  std::uint32_t max_key_bytes = 0;   // the consumer's
  std::uint32_t max_meta_bytes = 0;  // the consumer's
  std::uint64_t in_flight = 0;       // bytes sent, not yet acknowledged
  std::uint64_t next_blob_id = 1;
  std::error_code error;             // set once; every later call returns it
  std::string message;               // what broke, for protocol violations
  bool closing = false;              // shutdown() sent `close`
  bool reader_done = false;          // the ack reader has ended
  async_condition credit_cv;         // in_flight fell, or the connection ended
  async_condition reader_cv;         // reader_done became true
  sender_stats stats;
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
};

}  // namespace blobpipe::detail
