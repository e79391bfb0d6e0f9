#include "lib/transport/ucx/rendezvous.hpp"

#include <algorithm>
#include <random>

#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "lib/format/le.hpp"
#include "lib/transport/ucx/connection.hpp"

namespace blobpipe::ucx::detail {
namespace {

using blobpipe::detail::load_le;
using blobpipe::detail::store_le;
constexpr auto use_tuple = asio::experimental::as_tuple(asio::use_awaitable);
using outcome = std::tuple<std::error_code, std::shared_ptr<connection>>;

// The listener's hello: key and nonce before its address.
constexpr std::size_t listener_hello_prefix = 8 + nonce_bytes;

const char* type_name(rv_type t) noexcept {
  switch (t) {
    case rv_type::hello: return "hello";
    case rv_type::claim: return "claim";
    case rv_type::created: return "created";
    case rv_type::retry: return "retry";
    case rv_type::accepted: return "accepted";
  }
  return "unknown";
}

// ucp_ep_params for every endpoint of a connection: peer error mode, so a
// failing peer is reported (err_handler) rather than left hanging.
ucp_ep_params_t ep_params(connection& c) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler = c.err_handler();
  return p;
}

nonce random_nonce() {
  std::random_device rd;
  nonce n;
  for (std::size_t i = 0; i < n.size(); i += 4) store_le<std::uint32_t>(n.data() + i, rd());
  return n;
}

outcome failed(rv_attempt& a, std::error_code ec, std::string why) {
  if (a.why.empty()) a.why = std::move(why);
  a.abort(false);
  return {ec, nullptr};
}

// One message: header, then `parts` as its body.
// (Parts are a span, not an initializer_list: GCC 12 cannot keep a braced
// list's array in a coroutine frame, "array used as initializer".)
using parts = std::span<const std::span<const std::byte>>;
asio::awaitable<std::error_code> send(rv_attempt& a, rv_type t, std::uint8_t flags, parts body) {
  std::size_t n = 0;
  for (auto p : body) n += p.size();
  const auto header = encode_rv_header(t, flags, static_cast<std::uint32_t>(n));
  std::vector<asio::const_buffer> bufs{asio::buffer(header)};
  for (auto p : body) bufs.push_back(asio::buffer(p.data(), p.size()));
  auto [ec, written] = co_await asio::async_write(a.sock, bufs, use_tuple);
  if (ec) {
    if (a.why.empty()) a.why = std::string("rendezvous: sending ") + type_name(t) + ": " + ec.message();
    co_return a.failure(errc::peer_failed);
  }
  co_return std::error_code{};
}

// One message of an `allowed` type: its header checked before its body is
// read into `body`.
asio::awaitable<std::tuple<std::error_code, rv_header>> receive(
    rv_attempt& a, rv_types allowed, bool from_listener, std::vector<std::byte>& body) {
  using ret = std::tuple<std::error_code, rv_header>;
  std::array<std::byte, rv_header_bytes> raw;
  auto [ec, n] = co_await asio::async_read(a.sock, asio::buffer(raw), use_tuple);
  if (!ec) {
    auto h = decode_rv_header(raw, allowed, from_listener);
    if (!h) {
      a.why = "rendezvous: " + h.message();
      co_return ret{h.code(), {}};
    }
    body.resize(h->length);
    if (h->length == 0) co_return ret{std::error_code{}, *h};
    auto [bec, bn] = co_await asio::async_read(a.sock, asio::buffer(body), use_tuple);
    if (!bec) co_return ret{std::error_code{}, *h};
    ec = bec;
  }
  if (a.why.empty()) a.why = std::string("rendezvous: receiving: ") + ec.message();
  co_return ret{a.failure(errc::peer_failed), {}};
}

bool same_bytes(std::span<const std::byte> x, std::span<const std::byte> y) {
  return std::equal(x.begin(), x.end(), y.begin(), y.end());
}

// Listening side, loopback: both endpoints of the connection, numbers 2k
// and 2k+1 toward this worker (UCX pairs those), the connecting side's
// parked for it under a->parked.
std::error_code create_loopback_pair(runtime& rt, rv_attempt& a) {
  auto& pairs = rt.pairs();
  const auto self = rt.address();
  const std::uint32_t n = pairs.next(self);
  if (n % 2 != 0) pairs.skip_to(self, n + 1);
  auto x = connection::make(rt, {});
  for (auto* c : {a.conn.get(), x.get()}) {
    auto ep = pairs.create(self, ep_params(*c));
    if (!ep) {
      a.why = ep.message();
      x->close_now();
      return ep.code();
    }
    c->attach(*ep);
  }
  a.parked = rt.park(std::move(x));
  return {};
}

}  // namespace

std::array<std::byte, rv_header_bytes> encode_rv_header(rv_type t, std::uint8_t flags,
                                                        std::uint32_t length) noexcept {
  std::array<std::byte, rv_header_bytes> b{};
  std::copy(rv_magic.begin(), rv_magic.end(), b.begin());
  store_le<std::uint16_t>(b.data() + 8, rv_version);
  store_le<std::uint8_t>(b.data() + 10, static_cast<std::uint8_t>(t));
  store_le<std::uint8_t>(b.data() + 11, flags);
  store_le<std::uint32_t>(b.data() + 12, length);
  return b;
}

result<rv_header> decode_rv_header(std::span<const std::byte, rv_header_bytes> b,
                                   rv_types allowed, bool from_listener) {
  if (!std::equal(rv_magic.begin(), rv_magic.end(), b.begin()))
    return {errc::protocol_violation, "not a blobpipe UCX rendezvous (bad magic)"};
  if (const auto v = load_le<std::uint16_t>(b.data() + 8); v != rv_version)
    return {errc::protocol_violation,
            "rendezvous version " + std::to_string(v) + " (this side speaks " +
                std::to_string(rv_version) + ")"};
  rv_header h;
  const auto t = load_le<std::uint8_t>(b.data() + 10);
  h.type = static_cast<rv_type>(t);
  if (t >= 32 || (allowed & rv_types_of(h.type)) == 0)
    return {errc::protocol_violation, "unexpected rendezvous message type " + std::to_string(t)};
  h.flags = load_le<std::uint8_t>(b.data() + 11);
  const std::uint8_t flags_allowed =
      h.type == rv_type::hello && from_listener ? rv_flag_loopback : 0;
  if ((h.flags & ~flags_allowed) != 0)
    return {errc::protocol_violation,
            std::string("rendezvous ") + type_name(h.type) + " with unknown flags " +
                std::to_string(h.flags)};
  h.length = load_le<std::uint32_t>(b.data() + 12);
  std::uint64_t lo = 0, hi = 0;
  if (h.type == rv_type::hello) {
    lo = (from_listener ? listener_hello_prefix : 0) + 1;
    hi = lo - 1 + pairing::max_address_bytes;
  } else if (h.type == rv_type::claim) {
    lo = hi = 4;
  }
  if (h.length < lo || h.length > hi)
    return {errc::protocol_violation,
            std::string("rendezvous ") + type_name(h.type) + " of " + std::to_string(h.length) +
                " bytes (expected " + std::to_string(lo) + " to " + std::to_string(hi) + ")"};
  return h;
}

void rv_attempt::arm(std::chrono::milliseconds t) {
  bound.emplace(sock.get_executor(), t, [weak = weak_from_this()] {
    if (auto self = weak.lock()) self->abort(true);
  });
}

void rv_attempt::abort(bool timeout) noexcept {
  if (aborted) return;
  aborted = true;
  timed_out = timeout;
  if (timeout && why.empty()) why = "rendezvous: handshake timeout";
  std::error_code ignored;
  sock.close(ignored);
  if (!timeout) bound.reset();  // (on expiry, the deadline is what runs this)
  if (conn) conn->close_now();
  if (parked && rt) {
    if (auto x = rt->take(parked)) x->close_now();
    parked = 0;
  }
}

std::error_code rv_attempt::failure(errc otherwise) const noexcept {
  if (timed_out) return make_error_code(errc::timed_out);
  if (aborted) return make_error_code(errc::closed);
  return make_error_code(otherwise);
}

asio::awaitable<outcome> serve_rendezvous(std::shared_ptr<runtime> rt,
                                          std::shared_ptr<rv_attempt> a) {
  a->rt = rt;
  std::vector<std::byte> body;
  auto [hec, hello] = co_await receive(*a, rv_types_of(rv_type::hello), false, body);
  if (hec) co_return failed(*a, hec, {});
  const std::vector<std::byte> peer = std::move(body);
  if (!rt->pairs().same_format(peer))
    co_return failed(*a, make_error_code(errc::protocol_violation),
                     "rendezvous: the peer's worker address is of another UCX format");
  const nonce n = random_nonce();
  a->conn = connection::make(*rt, {});
  const bool loopback = same_bytes(peer, rt->address());
  if (loopback) {
    if (auto ec = create_loopback_pair(*rt, *a)) co_return failed(*a, ec, {});
  }
  rt->expect_verify(n, a->conn.get());
  struct forget {
    runtime& rt;
    const nonce& n;
    ~forget() { rt.forget_verify(n); }
  } forget_on_exit{*rt, n};

  std::array<std::byte, 8> key;
  store_le<std::uint64_t>(key.data(), a->parked);
  const std::array<std::span<const std::byte>, 3> hello_body{key, n, rt->address()};
  if (auto ec = co_await send(*a, rv_type::hello, loopback ? rv_flag_loopback : 0, hello_body))
    co_return failed(*a, ec, {});

  for (int claims = 0; !loopback; ++claims) {
    auto [cec, claim] = co_await receive(*a, rv_types_of(rv_type::claim), false, body);
    if (cec) co_return failed(*a, cec, {});
    const std::uint32_t sn = load_le<std::uint32_t>(body.data());
    auto& pairs = rt->pairs();
    if (sn > pairing::last_sn)
      co_return failed(*a, make_error_code(errc::protocol_violation),
                       "rendezvous: claim of number " + std::to_string(sn) + " (at most 65534)");
    if (sn < pairs.next(peer)) {
      // Already past it (another endpoint toward that worker took it):
      // the connecting side claims its next number.
      if (claims + 1 == rv_max_claims)
        co_return failed(*a, make_error_code(errc::peer_failed),
                         "rendezvous: the endpoints could not agree on a number");
      if (auto ec = co_await send(*a, rv_type::retry, 0, {})) co_return failed(*a, ec, {});
      continue;
    }
    pairs.skip_to(peer, sn);
    auto ep = pairs.create(peer, ep_params(*a->conn));
    if (!ep) co_return failed(*a, ep.code(), ep.message());
    a->conn->attach(*ep);
    rt->kick();
    if (auto ec = co_await send(*a, rv_type::created, 0, {})) co_return failed(*a, ec, {});
    break;
  }
  const bool paired = co_await a->conn->wait_verified();
  if (!paired)
    co_return failed(*a, a->failure(errc::peer_failed),
                     "rendezvous: the endpoints did not pair (am_verify came on another one, "
                     "or the connection ended first)");
  if (auto ec = co_await send(*a, rv_type::accepted, 0, {})) co_return failed(*a, ec, {});
  a->parked = 0;  // taken by the connecting side (it verified)
  a->bound.reset();
  auto c = std::move(a->conn);
  c->attach_link(std::move(a->sock));
  co_return outcome{std::error_code{}, std::move(c)};
}

asio::awaitable<outcome> join_rendezvous(std::shared_ptr<runtime> rt,
                                         std::shared_ptr<rv_attempt> a, transport_options opt) {
  std::vector<std::byte> body;
  const std::array<std::span<const std::byte>, 1> hello_body{rt->address()};
  if (auto ec = co_await send(*a, rv_type::hello, 0, hello_body)) co_return failed(*a, ec, {});
  auto [hec, hello] = co_await receive(*a, rv_types_of(rv_type::hello), true, body);
  if (hec) co_return failed(*a, hec, {});
  const std::uint64_t key = load_le<std::uint64_t>(body.data());
  nonce n;
  std::copy_n(body.begin() + 8, nonce_bytes, n.begin());
  const std::vector<std::byte> peer(body.begin() + listener_hello_prefix, body.end());
  if (!rt->pairs().same_format(peer))
    co_return failed(*a, make_error_code(errc::protocol_violation),
                     "rendezvous: the listener's worker address is of another UCX format");

  if (hello.flags & rv_flag_loopback) {
    // The listener is this worker: it made both endpoints.
    if (!same_bytes(peer, rt->address()))
      co_return failed(*a, make_error_code(errc::protocol_violation),
                       "rendezvous: a loopback hello from another worker");
    a->conn = rt->take(key);
    if (!a->conn)  // the listener gave up on it already (closed, timed out)
      co_return failed(*a, make_error_code(errc::peer_failed),
                       "rendezvous: the listener dropped the connection");
  }
  for (int claims = 0; !a->conn; ++claims) {
    if (claims == rv_max_claims)
      co_return failed(*a, make_error_code(errc::peer_failed),
                       "rendezvous: the endpoints could not agree on a number");
    // No other endpoint toward that worker may take a number until the
    // listener has created its own with this one.
    auto& lock = rt->pairing_lock();
    if (auto lec = co_await lock.lock()) co_return failed(*a, a->failure(errc::closed), {});
    blobpipe::detail::unlock_guard unlock(lock);
    auto c = connection::make(*rt, opt);
    const std::uint32_t sn = rt->pairs().next(peer);
    auto ep = rt->pairs().create(peer, ep_params(*c));
    if (!ep) co_return failed(*a, ep.code(), ep.message());
    c->attach(*ep);
    a->conn = c;
    rt->kick();
    std::array<std::byte, 4> claim;
    store_le<std::uint32_t>(claim.data(), sn);
    const std::array<std::span<const std::byte>, 1> claim_body{claim};
    if (auto ec = co_await send(*a, rv_type::claim, 0, claim_body)) co_return failed(*a, ec, {});
    auto [rec, answer] = co_await receive(*a, rv_types_of(rv_type::created) | rv_types_of(rv_type::retry), true, body);
    if (rec) co_return failed(*a, rec, {});
    if (answer.type == rv_type::retry) {
      a->conn = nullptr;
      c->close_now();
    }
  }
  a->conn->set_options(opt);
  if (auto ec = co_await a->conn->wait_connected())
    co_return failed(*a, a->failure(errc::peer_failed), "rendezvous: " + ec.message());
  if (auto ec = co_await a->conn->send_verify(n))
    co_return failed(*a, a->failure(errc::peer_failed), "rendezvous: " + ec.message());
  auto [aec, accepted] = co_await receive(*a, rv_types_of(rv_type::accepted), true, body);
  if (aec) co_return failed(*a, aec, {});
  a->bound.reset();
  auto c = std::move(a->conn);
  c->attach_link(std::move(a->sock));
  co_return outcome{std::error_code{}, std::move(c)};
}

}  // namespace blobpipe::ucx::detail
