// blobpipe/cluster/router.hpp — one producer side, K destinations (fan-out).
//
// A router holds one sender per destination URL (K trainer ranks, say) and
// picks each blob's destination by a policy: round-robin, a rank the
// caller gives (sample index mod K), or the destination with the fewest
// bytes outstanding. Every member of a blob group goes to one destination,
// so a GRPO group's samples meet on one rank. Each destination may be a
// resend session (router_options::resend): blobs then reach it exactly
// once across reconnects. A destination gone for good (its sender failed:
// a plain connection broke, or a resend session gave up) fails the blobs
// routed to it with its error; the others go on, and the round-robin and
// least-outstanding policies skip it.
//
//   auto [ec, r] = co_await blobpipe::router::start(ex, {"tcp://rank0:5555", "tcp://rank1:5555"},
//                                                   {.policy = blobpipe::route_policy::by_rank});
//   auto b = r.open_blob({.group = blobpipe::blob_group{g, G}, .rank = g % 2}).value();
//   co_await b.blob.emit("0@input_ids", blobpipe::value::tensor(ids));
//   co_await b.blob.finish();
//   co_await r.shutdown();
//
// Threading: a router and its senders live on the executor given to
// start(); call them from coroutines there.
// Source: docs/cluster.md "Fan-out".
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include "blobpipe/cluster/metrics.hpp"
#include "blobpipe/errors.hpp"
#include "blobpipe/pipeline/producer.hpp"

namespace blobpipe {

namespace detail {
struct router_state;
}

enum class route_policy {
  round_robin,        ///< the next live destination, in turn
  by_rank,            ///< route::rank mod K (required); a dead destination fails the blob
  least_outstanding,  ///< the live destination with the fewest bytes not yet acknowledged
};

struct router_options {
  route_policy policy = route_policy::round_robin;
  /// Every destination's sender (chunk size, stall timeout, resend budget).
  sender_options sender{};
  /// Each destination a resend session (sender::start with a connect
  /// function): exactly once per destination across reconnects.
  bool resend = false;
  /// A namespace for group ids (group_scope_of a job's or a step's name,
  /// say): when not 0, every route::group id goes on the wire as
  /// scoped_group_id(group_scope, id), so two jobs or steps sharing a
  /// server cannot collide on ids they chose alike (0, 1, 2 ...). The
  /// receiving application recognises its groups by the same function.
  /// 0: ids go as given. A convention against accidents, not a defence:
  /// any sender can still name any id (docs/cluster.md "Trust model for
  /// group ids"). A number, not a string, so the options stay a plain
  /// value: a std::string here, passed to router::start as a braced
  /// temporary, was freed from the caller's coroutine frame under GCC 12
  /// (ASan, router_test).
  std::uint64_t group_scope = 0;
};

/// The group_scope of a name (a job's or a step's): a 64-bit FNV-1a hash,
/// never 0. Pure; any thread.
std::uint64_t group_scope_of(std::string_view name) noexcept;

/// The group id that `id` in namespace `scope` becomes on the wire
/// (router_options::group_scope): distinct ids of one scope stay distinct
/// (a bijection of the 64-bit ids), and ids of two scopes coincide only by
/// chance (the scope mixed with the id by SplitMix64's finaliser). Pure;
/// any thread.
std::uint64_t scoped_group_id(std::uint64_t scope, std::uint64_t id) noexcept;

/// Where one blob goes (router::open_blob).
struct route {
  tag_t tag = random_tag();
  /// The blob's group: every member goes where the group's first went
  /// (chosen by the policy, or by `rank`).
  std::optional<blob_group> group;
  /// route_policy::by_rank: the destination, mod K. Others: ignored.
  std::optional<std::uint64_t> rank;
};

struct routed_blob {
  std::size_t destination = 0;  ///< index into the URLs given to start()
  blob_writer blob;
};

/// One destination's counters (sender_stats, in metrics form).
struct destination_stats {
  std::string url;
  std::error_code error;   ///< set once the destination is gone for good
  endpoint_metrics metrics;  ///< bytes: entries + tails; latency: not measured here
  sender_stats sender;
};

struct router_stats {
  endpoint_metrics total;
  std::vector<destination_stats> destinations;
  std::uint64_t routed = 0;       ///< blobs opened through the router
  std::uint64_t refused = 0;      ///< open_blob errors (a dead destination, a bad route)
};

class router {
 public:
  router() = default;
  router(router&&) noexcept = default;
  /// close() of the router held, then takes `o`'s destinations.
  router& operator=(router&&) noexcept;
  /// close().
  ~router();

  /// Starts a sender to every URL at once (a resend session each, with
  /// opt.resend). A destination that cannot be reached is gone for good
  /// (error(d)); start fails only when all are, and then returns a router
  /// whose destinations are all gone: size(), url(d), error(d) and
  /// failure_reason(d) say why each failed (open_blob refuses).
  /// Errors: invalid_argument (no URL; a URL that does not parse: the
  /// first such; parse_url has the message; the router is then empty),
  /// else the first destination's error when none started.
  static asio::awaitable<std::tuple<std::error_code, router>> start(
      asio::any_io_executor ex, std::vector<std::string> urls, router_options opt = {});

  /// Destinations, as many as the URLs given to start().
  std::size_t size() const noexcept;
  /// Destination `d`'s URL as given. REQUIRES: d < size().
  const std::string& url(std::size_t d) const;
  /// Empty while destination `d` is usable; its error once gone for good.
  std::error_code error(std::size_t d) const noexcept;
  /// Destination `d`'s sender (flush, stats). REQUIRES: d < size().
  sender& at(std::size_t d);
  /// Why destination `d` is gone, in one line, when its sender knows more
  /// than error(d) says (sender::failure_reason: a limit, the consumer's
  /// close reason, a resend session's give-up); empty otherwise, and for a
  /// plain destination whose connect failed. REQUIRES: d < size().
  const std::string& failure_reason(std::size_t d) const;

  /// Opens a blob on the destination the policy (or the group) picks.
  /// Errors: invalid_argument (by_rank without a rank; a group of size
  /// 0), the destination's error (by_rank or a group naming a destination
  /// gone for good), or the last destination's error when none is left.
  [[nodiscard]] result<routed_blob> open_blob(const route& r = {});

  /// Shuts every live destination down in order (sender::shutdown), all
  /// at once; open_blob refuses (closed) from then on, and error(d) keeps
  /// destination d's error from before or from its shutdown (empty: it
  /// ended in order). A second call returns at once.
  /// Errors: the first destination's shutdown error (a destination gone
  /// before is not counted: error(d) has it).
  asio::awaitable<std::error_code> shutdown();
  /// Closes every destination now.
  void close() noexcept;

  router_stats stats() const;
  /// stats() as one line of JSON (docs/cluster.md "Metrics").
  std::string stats_json() const;

 private:
  explicit router(std::shared_ptr<detail::router_state> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::router_state> state_;
};

/// `st` as one line of JSON (what router::stats_json prints; docs/cluster.md
/// "Metrics").
std::string to_json(const router_stats& st);

}  // namespace blobpipe
