// blobpipe/cluster/metrics.hpp — what a fan-in server and a router count.
//
// Both ends count the same things per connection and in total: entry
// bytes, entries, blobs, aborts, credit waits, reconnects, and the time to
// the first entry. The receiving end also keeps a latency histogram of
// emit -> entry_ready: the sender stamps its steady clock into each
// entry_begin (feature_entry_timestamps, docs/wire_features.md) and the
// server subtracts it from its own clock when it yields the entry. That
// figure holds only when both run on one host (steady clocks of two hosts
// share no epoch); across hosts it is meaningless, and the server keeps
// only stamps that are not in its future.
//
//   auto st = server.stats();
//   std::cout << st.total.latency.percentile(0.99) / 1e6 << " ms\n";
//   std::cout << server.stats_json() << "\n";          // one line, for logs
//   std::cout << blobpipe::to_json(sender.stats()) << "\n";
//
// Source: docs/cluster.md "Metrics".
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "blobpipe/pipeline/producer.hpp"

namespace blobpipe {

/// A histogram of durations in nanoseconds: log-linear buckets, 8 per
/// power of two, so a percentile is within 12.5% of the true value
/// (exact below 8 ns). Fixed size (about 4 KiB), no allocation.
class latency_histogram {
 public:
  void record(std::uint64_t ns) noexcept;
  void merge(const latency_histogram& o) noexcept;
  std::uint64_t count() const noexcept { return count_; }
  std::uint64_t max() const noexcept { return max_; }
  /// The `q` quantile (0 <= q <= 1), nanoseconds: the middle of the
  /// bucket holding it (never above max()); 0 when empty.
  std::uint64_t percentile(double q) const noexcept;

 private:
  static constexpr int sub_bits = 3;
  static constexpr std::size_t buckets = (64 - sub_bits + 1) << sub_bits;
  static std::size_t bucket_of(std::uint64_t ns) noexcept;
  static std::uint64_t bucket_low(std::size_t b) noexcept;
  std::array<std::uint64_t, buckets> counts_{};
  std::uint64_t count_ = 0;
  std::uint64_t max_ = 0;
};

/// One end's counters (a connection's, or the total of several).
struct endpoint_metrics {
  std::uint64_t bytes = 0;         ///< entry bytes received / sent
  std::uint64_t entries = 0;
  std::uint64_t blobs = 0;         ///< blobs completed / finished
  std::uint64_t aborts = 0;        ///< blobs aborted (final, not resend attempts)
  /// Times a sender waited for credit (the server counts the credit
  /// requests it received).
  std::uint64_t credit_waits = 0;
  std::uint64_t reconnects = 0;    ///< resend sessions' connections after the first
  latency_histogram latency;       ///< emit -> entry_ready (receiving end only)
  /// From the start (server: the first connection; router: start()) to
  /// the first entry, seconds; empty before one.
  std::optional<double> first_entry_s;

  /// Adds `o`'s counts (first_entry_s: the earlier).
  void merge(const endpoint_metrics& o) noexcept;
};

/// `m` as one JSON object: {"bytes":..,"entries":..,"blobs":..,"aborts":..,
/// "credit_waits":..,"reconnects":..,"latency_ms":{"count":..,"p50":..,
/// "p90":..,"p99":..,"max":..},"first_entry_s":..|null}.
std::string to_json(const endpoint_metrics& m);

/// A sender's counters (sender::stats()) as an endpoint's: bytes are entry
/// and tail bytes sent, blobs finished, aborts framed; latency is not
/// measured on this end. first_entry_s: from `since_ns` (the steady clock
/// in nanoseconds, e.g. when the sender started) to the first entry
/// emitted; empty when since_ns is 0 or no entry was emitted.
endpoint_metrics metrics_of(const sender_stats& st, std::uint64_t since_ns = 0) noexcept;

/// A sender's counters as one line of JSON:
/// {"role":"sender","total":<endpoint_metrics, since_ns as metrics_of>,
/// "credit_requests":..,"blobs_resent":..,"blobs_delivered":..,
/// "budget_waits":..}.
std::string to_json(const sender_stats& st, std::uint64_t since_ns = 0);

/// `s` as a JSON string literal (quotes, backslash and control characters
/// escaped; bytes >= 0x80 as they are).
std::string json_string(std::string_view s);

}  // namespace blobpipe
