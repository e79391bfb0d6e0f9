// test/reliability_fixture.hpp — scaffolding for the fault and resend
// tests: deterministic blobs and a checker that every blob arrives once and
// byte-identical; transports that break after N frames; a loopback
// "listener" so reconnecting works without sockets; one link interface
// over loopback and TCP (a UCX link can be added beside them).
#pragma once

#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "test/forwarding_transport.hpp"
#include "test/frame_scanner.hpp"
#include "test/pipeline_fixture.hpp"
#include "test/ucx_links.hpp"

namespace blobpipe::testing {

// ---- deterministic blobs ---------------------------------------------------

/// Blob number `i` of a test stream: tag "bp" + i, two entries of a few
/// floats and one int64, sizes varying with i.
struct blob_spec {
  tag_t tag{};
  std::vector<float> a;
  std::vector<std::int64_t> b;
};

inline tag_t tag_of(std::uint64_t i) {
  tag_t t{};
  t[0] = std::byte{'b'};
  t[1] = std::byte{'p'};
  std::memcpy(t.data() + 8, &i, 8);
  return t;
}

inline std::uint64_t index_of(const tag_t& t) {
  std::uint64_t i;
  std::memcpy(&i, t.data() + 8, 8);
  return i;
}

inline blob_spec make_blob(std::uint64_t i, std::size_t scale = 1) {
  blob_spec s;
  s.tag = tag_of(i);
  s.a = ramp(scale * (3 + i % 29), static_cast<float>(i));
  s.b = {static_cast<std::int64_t>(i) * 7919, -static_cast<std::int64_t>(i)};
  return s;
}

/// Emits blob `s` and finishes it. Returns the first error.
inline asio::awaitable<std::error_code> send_blob(sender& snd, const blob_spec& s) {
  auto w = snd.open_blob(s.tag);
  auto va = value::tensor(s.a);
  if (auto ec = co_await w.emit("a", std::move(va))) co_return ec;
  auto vb = value::tensor(s.b);
  if (auto ec = co_await w.emit("b", std::move(vb))) co_return ec;
  co_return co_await w.finish();
}

/// Follows a consumer's events across connections and checks the delivery
/// guarantee: each tag completes exactly once, with the bytes of its spec;
/// a blob_aborted with resend voids only its attempt.
struct delivery_checker {
  std::size_t scale = 1;
  std::map<std::uint64_t, int> completed;  // blob index -> blob_complete count
  std::uint64_t entries = 0, attempts_voided = 0, final_aborts = 0, bad = 0;
  std::uint64_t duplicates = 0;  // consumer_stats::duplicates_dropped, all connections
  std::string first_problem;

  struct attempt {
    std::vector<std::shared_ptr<const received_entry>> entries;
  };
  // Per connection (the consumer object), per blob id.
  std::map<std::pair<const void*, std::uint64_t>, attempt> open;

  void problem(std::string what) {
    ++bad;
    if (first_problem.empty()) first_problem = std::move(what);
  }

  /// Returns false at end_of_stream.
  bool on(const void* conn, const event& ev) {
    const auto key = std::pair{conn, ev.blob_id};
    switch (ev.kind) {
      case event_kind::entry_ready:
        ++entries;
        open[key].entries.push_back(ev.entry);
        return true;
      case event_kind::blob_aborted:
        if (ev.resend) ++attempts_voided;
        else ++final_aborts;
        open.erase(key);
        return true;
      case event_kind::blob_complete: {
        const auto i = index_of(ev.tag);
        auto& got = open[key].entries;
        const auto want = make_blob(i, scale);
        if (++completed[i] > 1) problem("blob " + std::to_string(i) + " completed twice");
        if (got.size() != 2 || !same(got[0]->view.bytes, want.a) ||
            !same(got[1]->view.bytes, want.b))
          problem("blob " + std::to_string(i) + " differs from what was sent");
        open.erase(key);
        return true;
      }
      case event_kind::end_of_stream:
        for (auto it = open.begin(); it != open.end();)
          it = it->first.first == conn ? open.erase(it) : std::next(it);
        return false;
    }
    return false;
  }

  template <class T>
  static bool same(std::span<const std::byte> got, const std::vector<T>& want) {
    return got.size() == want.size() * sizeof(T) &&
           std::memcmp(got.data(), want.data(), got.size()) == 0;
  }

  /// Every blob in [0, n) completed exactly once, nothing else.
  bool all_once(std::uint64_t n) const {
    if (completed.size() != n || bad != 0) return false;
    for (auto& [i, c] : completed)
      if (i >= n || c != 1) return false;
    return true;
  }
};

// ---- transports that break ---------------------------------------------------

/// Forwards to `inner`, and closes the connection (as a crash of this side
/// would: the peer sees it end) instead of sending frame number `kill_at`
/// (0-based, counting every frame this side sends), or instead of the
/// `kill_at_ack`-th delivery acknowledgement (an ack naming a blob). The
/// frames before it go out whole, however the writes group them.
class kill_switch final : public forwarding_transport {
 public:
  static constexpr std::uint64_t never = ~std::uint64_t{0};
  kill_switch(std::unique_ptr<transport> inner, std::uint64_t kill_at,
              std::uint64_t kill_at_ack = never)
      : forwarding_transport(std::move(inner)),
        scanner_([this, kill_at, kill_at_ack](const frame_header& h, std::uint64_t n) {
          const bool ack = h.type == frame_type::ack && h.blob_id != 0;
          return n == kill_at || (ack && acks_++ == kill_at_ack);
        }) {}
  ~kill_switch() override { inner().close(); }

  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) override {
    if (killed_) co_return make_error_code(errc::closed);
    std::vector<asio::const_buffer> out;
    for (const auto& b : bytes) {
      const auto cut = scanner_.feed(std::span(static_cast<const std::byte*>(b.data()), b.size()));
      if (!cut) {
        out.push_back(b);
        continue;
      }
      if (*cut != 0) out.emplace_back(b.data(), *cut);
      if (!out.empty()) (void)co_await inner().write(out);
      killed_ = true;
      inner().close();
      co_return make_error_code(errc::closed);
    }
    co_return co_await inner().write(out);
  }
  bool sends_bulk() const noexcept override { return false; }  // every frame through write()
  bool killed() const { return killed_; }

 private:
  frame_scanner scanner_;
  std::uint64_t acks_ = 0;
  bool killed_ = false;
};

/// A reconnect_link wrapper that loses the `nth` (0-based) delivery
/// acknowledgement the consumer of connection 0 sends: the connection ends
/// there instead, and later connections run undisturbed.
inline auto lose_first_connections_ack(std::uint64_t nth) {
  return [nth](std::unique_ptr<transport> t, int conn) -> std::unique_ptr<transport> {
    return std::make_unique<kill_switch>(std::move(t), kill_switch::never,
                                         conn == 0 ? nth : kill_switch::never);
  };
}

// ---- links: where reconnecting senders get their connections ---------------

using accept_result = std::tuple<std::error_code, std::unique_ptr<transport>>;

/// A listening side and a connect function for the sender. `wrap` (if set)
/// decorates the sender's end of connection number n (0-based), `wrap_c`
/// the consumer's.
class reconnect_link {
 public:
  using wrapper = std::function<std::unique_ptr<transport>(std::unique_ptr<transport>, int)>;
  virtual ~reconnect_link() = default;
  virtual std::string name() const = 0;
  virtual connect_fn connector() = 0;
  virtual asio::awaitable<accept_result> accept() = 0;
  /// Stops accepting: a pending accept fails, later connects fail.
  virtual void close() = 0;
  int connections() const { return made_; }

  wrapper wrap, wrap_c;
  std::function<void()> on_close;  // also run by close() (e.g. stop a proxy)

 protected:
  std::unique_ptr<transport> wrapped(std::unique_ptr<transport> t, const wrapper& w, int n) {
    return w ? w(std::move(t), n) : std::move(t);
  }
  int made_ = 0;
};

/// Loopback pairs: connect() makes one and queues the consumer's end.
class loopback_link final : public reconnect_link {
 public:
  explicit loopback_link(asio::any_io_executor ex) : ex_(ex), wake_(ex) {
    wake_.expires_at(asio::steady_timer::time_point::max());
  }
  std::string name() const override { return "loopback"; }
  connect_fn connector() override {
    return [this]() -> asio::awaitable<accept_result> {
      if (closed_) co_return accept_result{make_error_code(errc::peer_failed), nullptr};
      auto [a, b] = loopback::make_pair(ex_);
      const int n = made_++;
      queue_.push_back(wrapped(std::move(b), wrap_c, n));
      wake_.cancel();
      co_return accept_result{std::error_code{}, wrapped(std::move(a), wrap, n)};
    };
  }
  asio::awaitable<accept_result> accept() override {
    while (queue_.empty() && !closed_) {
      wake_.expires_at(asio::steady_timer::time_point::max());
      co_await wake_.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    }
    if (queue_.empty()) co_return accept_result{make_error_code(errc::closed), nullptr};
    auto t = std::move(queue_.front());
    queue_.pop_front();
    co_return accept_result{std::error_code{}, std::move(t)};
  }
  void close() override {
    closed_ = true;
    wake_.cancel();
    if (on_close) on_close();
  }

 private:
  asio::any_io_executor ex_;
  asio::steady_timer wake_;
  std::deque<std::unique_ptr<transport>> queue_;
  bool closed_ = false;
};

/// Connections through a real listener (blobpipe::listener) on 127.0.0.1,
/// made by `dial(port)`; optionally through `via_port` (a fault_proxy in
/// front of the listener).
class listener_link : public reconnect_link {
 public:
  using dial_fn = std::function<asio::awaitable<accept_result>(std::uint16_t port)>;
  listener_link(std::string name, std::unique_ptr<listener> lis, dial_fn dial)
      : name_(std::move(name)), lis_(std::move(lis)), dial_(std::move(dial)) {}
  std::string name() const override { return name_; }
  std::uint16_t listen_port() const { return lis_->port(); }
  std::uint16_t via_port = 0;
  connect_fn connector() override {
    return [this]() -> asio::awaitable<accept_result> {
      auto [ec, t] = co_await dial_(via_port ? via_port : lis_->port());
      if (ec) co_return accept_result{ec, nullptr};
      co_return accept_result{std::error_code{}, wrapped(std::move(t), wrap, made_++)};
    };
  }
  asio::awaitable<accept_result> accept() override {
    auto [ec, t] = co_await lis_->accept();
    if (ec) co_return accept_result{ec, nullptr};
    co_return accept_result{std::error_code{}, wrapped(std::move(t), wrap_c, accepted_++)};
  }
  void close() override {
    lis_->close();
    if (on_close) on_close();
  }

 private:
  std::string name_;
  std::unique_ptr<listener> lis_;
  dial_fn dial_;
  int accepted_ = 0;
};

/// TCP on 127.0.0.1, an ephemeral port.
class tcp_link final : public listener_link {
 public:
  explicit tcp_link(asio::any_io_executor ex)
      : listener_link("tcp", std::make_unique<tcp::listener>(tcp::listen(ex, 0).value()),
                      [ex](std::uint16_t port) { return tcp::connect(ex, "127.0.0.1", port); }) {}
};

/// UCX on 127.0.0.1 with one configuration of test/ucx_links.hpp. Each
/// connection made is checked for the configuration's transport (its
/// connected end, whose lanes are final once connect() returns):
/// wrong_lane() says what UCX selected instead, the first time it did.
class ucx_reconnect_link final : public listener_link {
 public:
  ucx_reconnect_link(asio::any_io_executor ex, const ucx_link& l)
      : listener_link("ucx/" + l.name,
                      std::make_unique<ucx::listener>(ucx::listen(ex, 0, "127.0.0.1", l.opt).value()),
                      [this, ex, l](std::uint16_t port) -> asio::awaitable<accept_result> {
                        auto [ec, t] = co_await ucx::connect(ex, "127.0.0.1", port, {}, l.opt);
                        if (!ec) {
                          std::string why;
                          if (selected(l, *t, why)) ++checked_;
                          else if (wrong_lane_.empty()) wrong_lane_ = why;
                        }
                        co_return accept_result{ec, std::move(t)};
                      }) {}
  /// Connections made over the configuration's transport.
  int lanes_checked() const { return checked_; }
  /// Empty, or what UCX selected instead of the configuration's transport.
  const std::string& wrong_lane() const { return wrong_lane_; }

 private:
  int checked_ = 0;
  std::string wrong_lane_;
};

inline std::unique_ptr<reconnect_link> make_link(link_kind k, asio::any_io_executor ex) {
  if (k == link_kind::loopback) return std::make_unique<loopback_link>(ex);
  if (is_ucx(k)) return std::make_unique<ucx_reconnect_link>(ex, ucx_config(k));
  return std::make_unique<tcp_link>(ex);
}

/// One connection of serve(): a consumer until its stream ends.
struct serve_state {
  delivery_checker* check;
  consumer_options copt;
  std::set<consumer*> live;  // consumers still reading
  int handlers = 0;
  asio::steady_timer idle;   // wakes serve() when the last handler ends
  explicit serve_state(asio::any_io_executor ex) : idle(ex) {}
};

inline asio::awaitable<void> serve_one(std::shared_ptr<serve_state> st,
                                       std::unique_ptr<transport> t) {
  auto [ec, c] = co_await consumer::start(std::move(t), st->copt);
  if (!ec) {  // else killed during the handshake: the sender retries
    st->live.insert(&c);
    for (;;) {
      auto ev = co_await c.next();
      if (!st->check->on(&c, ev)) break;
    }
    st->live.erase(&c);
    st->check->duplicates += c.stats().duplicates_dropped;
  }
  if (--st->handlers == 0) st->idle.cancel();
}

/// The trainer side of a resend session: accepts connections and runs a
/// consumer on each at once (sharing `log`), as a trainer serving many
/// workers does, so a connection whose end has not been noticed yet never
/// holds up the next. Feeds every event to `check`. When accepting fails
/// (the link was closed) or `done()`, closes the consumers still open and
/// returns once all have ended.
inline asio::awaitable<void> serve(reconnect_link& l, std::shared_ptr<delivery_log> log,
                                   delivery_checker& check, std::function<bool()> done,
                                   consumer_options copt = {}) {
  auto ex = co_await asio::this_coro::executor;
  auto st = std::make_shared<serve_state>(ex);
  st->check = &check;
  st->copt = std::move(copt);
  st->copt.delivered = std::move(log);
  while (!done()) {
    auto [aec, t] = co_await l.accept();
    if (aec) break;
    ++st->handlers;
    asio::co_spawn(ex, serve_one(st, std::move(t)), asio::detached);
  }
  for (consumer* c : std::set<consumer*>(st->live)) c->close();
  while (st->handlers > 0) {
    st->idle.expires_at(asio::steady_timer::time_point::max());
    co_await st->idle.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
}

}  // namespace blobpipe::testing
