// The fan-out router (blobpipe/cluster/router.hpp): one sender per
// destination, a policy per blob, groups kept together. docs/cluster.md
// "Fan-out".
#include "blobpipe/cluster/router.hpp"

#include <chrono>
#include <map>

#include <asio/error.hpp>

#include "blobpipe/transport/url.hpp"
#include "lib/runtime/task_group.hpp"

namespace blobpipe {
namespace detail {
namespace {

/// The steady clock in nanoseconds (sender_stats::first_entry_ns's).
std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace

struct destination {
  std::string url;
  sender s;
  bool started = false;
  std::error_code start_error;  // why it never started
  std::error_code end_error;    // after router::shutdown: its error then, or shutdown's
};

struct router_state {
  router_state(asio::any_io_executor e, router_options o)
      : ex(std::move(e)), opt(std::move(o)), tasks(ex) {}

  /// Empty while `d` is usable; why not otherwise.
  std::error_code gone(std::size_t d) const noexcept {
    const destination& x = dests[d];
    if (!x.started) return x.start_error;
    if (shut) return x.end_error;
    return x.s.error();
  }
  /// Bytes sent to `d` and not yet acknowledged (credit held; resend: kept).
  std::uint64_t outstanding(std::size_t d) const noexcept {
    return dests[d].s.in_flight_bytes() + dests[d].s.unacked_bytes();
  }
  /// The destination the policy picks for a blob of no group yet.
  result<std::size_t> pick(const route& r);

  asio::any_io_executor ex;
  router_options opt;
  std::vector<destination> dests;
  std::size_t next = 0;  // round-robin position
  // Groups being routed: id -> (destination, members routed so far).
  std::map<std::uint64_t, std::pair<std::size_t, std::uint32_t>> groups;
  std::uint64_t routed = 0;
  std::uint64_t refused = 0;
  std::uint64_t started_ns = 0;
  bool shut = false;  // router::shutdown ran: open_blob refuses, gone() is end_error
  // Each destination's start (start_one) and shutdown (shutdown_one):
  // router::start and router::shutdown join them before they return. They
  // end on their own (a connect or handshake bounded by its timeout, a
  // sender's shutdown ended by close()), so nothing cancels them.
  task_group tasks;
};

result<std::size_t> router_state::pick(const route& r) {
  const std::size_t k = dests.size();
  if (opt.policy == route_policy::by_rank) {
    if (!r.rank) return {errc::invalid_argument, "route: by_rank needs a rank"};
    return static_cast<std::size_t>(*r.rank % k);
  }
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < k; ++i) {
    const std::size_t d = (next + i) % k;
    if (gone(d)) continue;
    if (opt.policy == route_policy::round_robin) {
      best = d;
      break;
    }
    if (!best || outstanding(d) < outstanding(*best)) best = d;
  }
  if (!best) {
    const auto last = gone((next + k - 1) % k);
    return error{last ? last : make_error_code(errc::closed), "route: every destination is gone"};
  }
  next = (*best + 1) % k;
  return *best;
}

namespace {

/// Starts destination `d`: its sender, or its start_error.
asio::awaitable<void> start_one(std::shared_ptr<router_state> s, std::size_t d,
                                connect_function connect) {
  destination& x = s->dests[d];
  std::error_code ec;
  sender snd;
  if (s->opt.resend) {
    std::tie(ec, snd) = co_await sender::start(connect, s->opt.sender);
  } else {
    auto [cec, t] = co_await connect();
    ec = cec;
    if (!ec) std::tie(ec, snd) = co_await sender::start(std::move(t), s->opt.sender);
  }
  x.s = std::move(snd);  // failed, it still says why (failure_reason)
  if (ec) x.start_error = ec;
  else x.started = true;
}

/// Shuts destination `d` down; its error into `out`.
asio::awaitable<void> shutdown_one(std::shared_ptr<router_state> s, std::size_t d) {
  s->dests[d].end_error = co_await s->dests[d].s.shutdown();
}

}  // namespace
}  // namespace detail

router& router::operator=(router&& o) noexcept {
  if (this != &o) {
    close();
    state_ = std::move(o.state_);
  }
  return *this;
}

router::~router() { close(); }

asio::awaitable<std::tuple<std::error_code, router>> router::start(asio::any_io_executor ex,
                                                                   std::vector<std::string> urls,
                                                                   router_options opt) {
  using ret = std::tuple<std::error_code, router>;
  if (urls.empty()) co_return ret{make_error_code(errc::invalid_argument), router{}};
  std::vector<connect_function> connects;
  for (const auto& u : urls) {
    auto c = connector(ex, u);
    if (!c) co_return ret{c.code(), router{}};
    connects.push_back(std::move(*c));
  }
  auto s = std::make_shared<detail::router_state>(ex, std::move(opt));
  s->started_ns = detail::now_ns();
  s->dests.resize(urls.size());
  for (std::size_t d = 0; d < urls.size(); ++d) {
    s->dests[d].url = std::move(urls[d]);
    s->tasks.spawn(detail::start_one(s, d, std::move(connects[d])));
  }
  co_await s->tasks.join();
  // Cancelled while they ran: they end on their own, holding the state.
  if (s->tasks.running() != 0)
    co_return ret{std::error_code(asio::error::operation_aborted), router{}};
  std::error_code first;
  for (std::size_t d = 0; d < s->dests.size(); ++d) {
    if (s->dests[d].started) co_return ret{std::error_code{}, router(std::move(s))};
    if (!first) first = s->dests[d].start_error;
  }
  // Failed, its destinations still say why (error(d), failure_reason(d)).
  co_return ret{first, router(std::move(s))};
}

std::size_t router::size() const noexcept { return state_ ? state_->dests.size() : 0; }
const std::string& router::url(std::size_t d) const { return state_->dests.at(d).url; }
std::error_code router::error(std::size_t d) const noexcept {
  return state_ && d < state_->dests.size() ? state_->gone(d) : make_error_code(errc::closed);
}
sender& router::at(std::size_t d) { return state_->dests.at(d).s; }
const std::string& router::failure_reason(std::size_t d) const {
  return state_->dests.at(d).s.failure_reason();
}

result<routed_blob> router::open_blob(const route& r) {
  if (!state_) return {errc::closed, "router: not started"};
  auto& s = *state_;
  if (s.shut) {
    ++s.refused;
    return {errc::closed, "router: shut down"};
  }
  const auto refuse = [&](blobpipe::error e) -> result<routed_blob> {
    ++s.refused;
    return e;
  };
  if (r.group && r.group->size == 0)
    return refuse(make_error(errc::invalid_argument, "route: a group of size 0"));
  std::size_t d = 0;
  auto g = r.group ? s.groups.find(r.group->id) : s.groups.end();
  if (g != s.groups.end()) {
    d = g->second.first;
  } else {
    auto picked = s.pick(r);
    if (!picked) return refuse(picked.err());
    d = *picked;
    if (r.group && r.group->size > 1) g = s.groups.emplace(r.group->id, std::pair{d, 0u}).first;
  }
  if (auto ec = s.gone(d))
    return refuse(blobpipe::error{ec, "route: destination " + std::to_string(d) + " (" + s.dests[d].url +
                                ") is gone: " + ec.message()});
  if (g != s.groups.end() && ++g->second.second >= r.group->size) s.groups.erase(g);
  ++s.routed;
  auto wire_group = r.group;  // the router keeps the application's ids; the wire, the scoped ones
  if (wire_group && s.opt.group_scope != 0)
    wire_group->id = scoped_group_id(s.opt.group_scope, wire_group->id);
  return routed_blob{d, s.dests[d].s.open_blob(blob_options{.tag = r.tag, .group = wire_group})};
}

std::uint64_t group_scope_of(std::string_view name) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (const char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h == 0 ? 1 : h;  // 0 means no scope
}

std::uint64_t scoped_group_id(std::uint64_t scope, std::uint64_t id) noexcept {
  // SplitMix64's finaliser: a bijection of the 64-bit values.
  const auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  return mix(scope ^ mix(id));
}

asio::awaitable<std::error_code> router::shutdown() {
  auto s = state_;
  if (!s) co_return make_error_code(errc::closed);
  if (s->shut) co_return std::error_code{};
  std::vector<bool> live(s->dests.size());
  for (std::size_t d = 0; d < s->dests.size(); ++d) live[d] = !s->gone(d);
  s->shut = true;  // open_blob refuses from here
  for (std::size_t d = 0; d < s->dests.size(); ++d) {
    auto& x = s->dests[d];
    if (!x.started) continue;
    if (!live[d]) {
      x.end_error = x.s.error();
      continue;
    }
    s->tasks.spawn(detail::shutdown_one(s, d));
  }
  co_await s->tasks.join();
  if (s->tasks.running() != 0) co_return std::error_code(asio::error::operation_aborted);
  for (std::size_t d = 0; d < s->dests.size(); ++d)
    if (live[d] && s->dests[d].end_error) co_return s->dests[d].end_error;
  co_return std::error_code{};
}

void router::close() noexcept {
  if (!state_) return;
  for (auto& x : state_->dests)
    if (x.started) x.s.close();
}

router_stats router::stats() const {
  router_stats st;
  if (!state_) return st;
  const auto& s = *state_;
  st.routed = s.routed;
  st.refused = s.refused;
  for (std::size_t d = 0; d < s.dests.size(); ++d) {
    destination_stats ds;
    ds.url = s.dests[d].url;
    ds.error = s.gone(d);
    if (s.dests[d].started) ds.sender = s.dests[d].s.stats();
    ds.metrics = metrics_of(ds.sender, s.started_ns);
    st.total.merge(ds.metrics);
    st.destinations.push_back(std::move(ds));
  }
  return st;
}

std::string router::stats_json() const { return to_json(stats()); }

std::string to_json(const router_stats& st) {
  std::string out = "{\"role\":\"router\",\"routed\":" + std::to_string(st.routed) +
                    ",\"refused\":" + std::to_string(st.refused) + ",\"total\":" +
                    to_json(st.total) + ",\"destinations\":[";
  bool first = true;
  for (const auto& d : st.destinations) {
    if (!first) out += ",";
    first = false;
    out += "{\"url\":" + json_string(d.url) + ",\"error\":" +
           (d.error ? json_string(d.error.message()) : std::string("null")) +
           ",\"metrics\":" + to_json(d.metrics) + "}";
  }
  return out + "]}";
}

}  // namespace blobpipe
