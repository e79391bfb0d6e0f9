// blobpipe/pipeline/delivery.hpp — remembering which blobs a consumer delivered.
//
// A sender in a resend session (blobpipe/pipeline/producer.hpp, sender::start with a
// connect function) keeps every blob until the consumer acknowledges its
// delivery, and sends the unacknowledged ones again after a reconnect. Some
// of those the consumer may already have delivered: their acknowledgement
// was lost with the connection. The consumer drops such a duplicate by its
// tag, looked up in a delivery_log, so the application sees each blob once.
//
//   auto log = std::make_shared<blobpipe::delivery_log>();   // one per trainer
//   for (;;) {                                // every connection a listener accepts
//     auto [e1, t] = co_await listener.accept();
//     auto [e2, c] = co_await blobpipe::consumer::start(std::move(t), {.delivered = log});
//     ...
//   }
//
// Bound: per session (one sender, across its reconnects) the tags of the
// last `window` blobs delivered (completed, or aborted by the producer);
// at most `max_sessions` sessions, the least recently used forgotten first.
// Memory is at most about window x max_sessions x 64 bytes (defaults:
// 4096 x 256, 64 MiB; a session costs what it used). The consumer advertises
// `window` in its hello and the sender never holds more unacknowledged
// blobs than that, which is what makes the window enough: a blob resent is
// always among the last `window` the consumer delivered for that session
// (docs/reliability.md has the argument).
//
// Thread-safe: consumers on different threads may share one log.
// Source: docs/wire.md "Delivery", docs/reliability.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "blobpipe/format/footer.hpp"
#include "blobpipe/protocol/delivered_tags.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace blobpipe {

inline constexpr std::uint32_t default_dedup_window = 4096;   ///< tags per session
inline constexpr std::size_t default_max_sessions = 256;

class delivery_log final : public delivered_tags {
 public:
  /// REQUIRES: window >= 1, max_sessions >= 1.
  explicit delivery_log(std::uint32_t window = default_dedup_window,
                        std::size_t max_sessions = default_max_sessions);
  ~delivery_log() override;
  delivery_log(const delivery_log&) = delete;
  delivery_log& operator=(const delivery_log&) = delete;

  /// Tags remembered per session (advertised as the hello's dedup_window).
  std::uint32_t window() const noexcept { return window_; }

  /// True when `tag` was recorded for `session` and is still remembered.
  bool contains(const session_id& session, const tag_t& tag) const override;

  /// Records `tag` as delivered for `session`. Beyond the window the
  /// session's oldest tag is forgotten; beyond max_sessions, the least
  /// recently used session. Recording a remembered tag again changes nothing.
  void record(const session_id& session, const tag_t& tag) override;

  std::size_t sessions() const;   ///< sessions remembered now
  std::size_t tags() const;       ///< tags remembered now, all sessions

  /// The log consumers use when consumer_options::delivered is null: one per
  /// process, with the default bounds.
  static std::shared_ptr<delivery_log> process_default();

 private:
  struct session_rec;
  struct key_hash {
    std::size_t operator()(const std::array<std::byte, 16>& k) const noexcept;
  };
  std::uint32_t window_;
  std::size_t max_sessions_;
  mutable std::mutex mu_;
  std::uint64_t clock_ = 0;  // use counter for least-recently-used eviction
  std::unordered_map<session_id, std::unique_ptr<session_rec>, key_hash> sessions_;
};

}  // namespace blobpipe
