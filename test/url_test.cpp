// blobpipe/transport/url.hpp: parsing, bad URLs naming their part, and
// listen/connect over tcp://, ucx:// and inproc://.
#define BOOST_TEST_MODULE url_test
#include <boost/test/unit_test.hpp>

#include <array>
#include <string>
#include <thread>

#include <asio/experimental/awaitable_operators.hpp>

// url.hpp first: its connect() must not disturb loopback::make_pair's
// overloads (pipeline_fixture.hpp's raw_pair) whatever the include order.
#include "blobpipe/transport/url.hpp"
#include "test/pipeline_fixture.hpp"
#include "test/skip.hpp"

using namespace blobpipe;
using blobpipe::testing::runner;

namespace {

/// Writes "ping" on `a`, reads it on `b`; true when it arrived intact.
asio::awaitable<bool> ping(transport& a, transport& b) {
  const std::array<char, 4> out{'p', 'i', 'n', 'g'};
  const asio::const_buffer buf(out.data(), out.size());
  std::array<std::byte, 4> in{};
  auto read = [&]() -> asio::awaitable<std::error_code> { co_return co_await b.read_exact(in); };
  using namespace asio::experimental::awaitable_operators;
  auto [wec, rec] = co_await (a.write(std::span(&buf, 1)) && read());
  co_return !wec && !rec && std::memcmp(in.data(), out.data(), 4) == 0;
}

/// The message of a URL parse_url refuses (its code checked).
std::string refusal(std::string_view url) {
  auto u = parse_url(url);
  BOOST_TEST(!u, url << " parsed");
  BOOST_TEST((u.code() == errc::invalid_argument), url << ": " << u.message());
  return u.message();
}

bool names(const std::string& message, std::string_view part) {
  return message.find(part) != std::string::npos;
}

}  // namespace

BOOST_AUTO_TEST_CASE(parse_url_takes_every_scheme_and_prints_it_back) {
  struct good {
    const char* url;
    url_scheme scheme;
    const char* host;
    std::uint16_t port;
  };
  const good cases[] = {
      {"tcp://127.0.0.1:5555", url_scheme::tcp, "127.0.0.1", 5555},
      {"tcp://trainer-0.example:0", url_scheme::tcp, "trainer-0.example", 0},
      {"tcp://[::1]:65535", url_scheme::tcp, "::1", 65535},
      {"ucx://10.0.0.2:7000", url_scheme::ucx, "10.0.0.2", 7000},
      {"inproc://rank_1.a-b", url_scheme::inproc, "rank_1.a-b", 0},
  };
  for (const auto& c : cases) {
    auto u = parse_url(c.url);
    BOOST_TEST_REQUIRE(u.has_value(), c.url << ": " << u.message());
    BOOST_TEST((u->scheme == c.scheme));
    BOOST_TEST(u->host == c.host);
    BOOST_TEST(u->port == c.port);
    BOOST_TEST(u->str() == c.url);
  }
}

BOOST_AUTO_TEST_CASE(parse_url_refuses_bad_urls_naming_the_part) {
  BOOST_TEST(names(refusal("127.0.0.1:5555"), "no scheme"));
  BOOST_TEST(names(refusal("http://h:1"), "unknown scheme 'http'"));
  BOOST_TEST(names(refusal("tcp://:5555"), "empty host"));
  BOOST_TEST(names(refusal("tcp://::1:5555"), "brackets"));
  BOOST_TEST(names(refusal("tcp://fe80::1:5555"), "brackets"));
  BOOST_TEST(names(refusal("tcp://[::1:5555"), "without ']'"));
  BOOST_TEST(names(refusal("tcp://[1.2.3.4]:5555"), "not an IPv6 address"));
  BOOST_TEST(names(refusal("tcp://ho st:5555"), "host 'ho st'"));
  BOOST_TEST(names(refusal("tcp://host"), "no port"));
  BOOST_TEST(names(refusal("tcp://host:"), "port ''"));
  BOOST_TEST(names(refusal("tcp://host:http"), "port 'http'"));
  BOOST_TEST(names(refusal("tcp://host:65536"), "port '65536'"));
  BOOST_TEST(names(refusal("tcp://host:-1"), "port '-1'"));
  BOOST_TEST(names(refusal("tcp://host:80/path"), "'/path' after the port"));
  BOOST_TEST(names(refusal("ucx://host/x"), "'/x' after the host"));
  BOOST_TEST(names(refusal("inproc://"), "empty inproc name"));
  BOOST_TEST(names(refusal("inproc://a/b"), "inproc name 'a/b'"));
}

BOOST_AUTO_TEST_CASE(connect_and_connector_refuse_bad_urls_and_port_zero) {
  runner r;
  auto c = connector(r.ex(), "tcp://127.0.0.1:0");
  BOOST_TEST((c.code() == errc::invalid_argument));
  BOOST_TEST(names(c.message(), "port 0"));
  BOOST_TEST((connector(r.ex(), "udp://h:1").code() == errc::invalid_argument));
  auto [ec, t] = r.await(connect(r.ex(), "tcp:/127.0.0.1:1"));
  BOOST_TEST((ec == errc::invalid_argument));
  BOOST_TEST(!t);
  auto l = listen(r.ex(), "sctp://127.0.0.1:0");
  BOOST_TEST((l.code() == errc::invalid_argument));
}

BOOST_AUTO_TEST_CASE(tcp_port_zero_reports_the_bound_port_and_both_ends_name_their_peer) {
  runner r;
  auto l = listen(r.ex(), "tcp://127.0.0.1:0");
  BOOST_TEST_REQUIRE(l.has_value(), l.message());
  const auto port = (*l)->port();
  BOOST_TEST(port != 0);
  BOOST_TEST((*l)->url() == "tcp://127.0.0.1:" + std::to_string(port));
  auto [cec, client] = r.await(connect(r.ex(), (*l)->url()));
  BOOST_TEST_REQUIRE(!cec, cec.message());
  auto [aec, server] = r.await((*l)->accept());
  BOOST_TEST_REQUIRE(!aec, aec.message());
  BOOST_TEST(client->peer_address() == (*l)->url());
  BOOST_TEST(server->peer_address().starts_with("tcp://127.0.0.1:"));
  BOOST_TEST(server->peer_address() != (*l)->url());  // the client's own port
  BOOST_TEST(r.await(ping(*client, *server)));
}

BOOST_AUTO_TEST_CASE(a_host_name_is_resolved_for_listening) {
  runner r;
  auto l = listen(r.ex(), "tcp://localhost:0");
  BOOST_TEST_REQUIRE(l.has_value(), l.message());
  BOOST_TEST(((*l)->endpoint().host == "127.0.0.1" || (*l)->endpoint().host == "::1"));
  auto bad = listen(r.ex(), "tcp://no-such-host.invalid:0");
  BOOST_TEST((bad.code() == errc::invalid_argument));
}

BOOST_AUTO_TEST_CASE(check_connect_url_refuses_what_no_retry_fixes) {
  runner r;
  auto ok = check_connect_url(r.ex(), "tcp://localhost:5630");
  BOOST_TEST_REQUIRE(ok.has_value(), ok.message());
  BOOST_TEST(ok->host == "localhost");  // checked, not replaced: connect tries every address
  BOOST_TEST(check_connect_url(r.ex(), "inproc://nobody-needs-to-listen").has_value());
  auto name = check_connect_url(r.ex(), "tcp://no-such-host.invalid:5630");
  BOOST_TEST((name.code() == errc::invalid_argument));
  BOOST_TEST(names(name.message(), "cannot resolve 'no-such-host.invalid'"));
  auto v6 = check_connect_url(r.ex(), "ucx://[::1]:5630");
  BOOST_TEST((v6.code() == errc::invalid_argument));
  BOOST_TEST(names(v6.message(), "IPv6"));
  BOOST_TEST(names(check_connect_url(r.ex(), "tcp://127.0.0.1:0").message(), "port 0"));
}

BOOST_AUTO_TEST_CASE(a_port_in_use_is_peer_failed) {
  runner r;
  auto a = listen(r.ex(), "tcp://127.0.0.1:0");
  BOOST_TEST_REQUIRE(a.has_value(), a.message());
  // Another socket on the same address and port (SO_REUSEADDR allows
  // TIME_WAIT reuse, not two listeners).
  auto b = listen(r.ex(), (*a)->url());
  BOOST_TEST((b.code() == errc::peer_failed));
}

BOOST_AUTO_TEST_CASE(inproc_listener_accepts_connections_by_name) {
  runner r;
  auto l = listen(r.ex(), "inproc://url-test-a");
  BOOST_TEST_REQUIRE(l.has_value(), l.message());
  BOOST_TEST((*l)->port() == 0);
  BOOST_TEST((*l)->url() == "inproc://url-test-a");
  auto [cec, client] = r.await(connect(r.ex(), "inproc://url-test-a"));
  BOOST_TEST_REQUIRE(!cec, cec.message());
  auto [cec2, client2] = r.await(connect(r.ex(), "inproc://url-test-a"));
  BOOST_TEST_REQUIRE(!cec2, cec2.message());
  auto [aec, server] = r.await((*l)->accept());
  BOOST_TEST_REQUIRE(!aec, aec.message());
  auto [aec2, server2] = r.await((*l)->accept());
  BOOST_TEST_REQUIRE(!aec2, aec2.message());
  BOOST_TEST(client->peer_address() == "inproc://url-test-a");
  BOOST_TEST(server->peer_address() == "inproc://url-test-a#1");
  BOOST_TEST(server2->peer_address() == "inproc://url-test-a#2");
  BOOST_TEST(r.await(ping(*client, *server)));
  BOOST_TEST(r.await(ping(*server2, *client2)));
}

BOOST_AUTO_TEST_CASE(inproc_names_are_unique_and_freed_by_close) {
  runner r;
  auto l = listen(r.ex(), "inproc://url-test-b");
  BOOST_TEST_REQUIRE(l.has_value(), l.message());
  BOOST_TEST((listen(r.ex(), "inproc://url-test-b").code() == errc::peer_failed));
  auto [nec, none] = r.await(connect(r.ex(), "inproc://url-test-nobody"));
  BOOST_TEST((nec == errc::peer_failed));
  // A connection still in the backlog when the listener closes is closed.
  auto [cec, client] = r.await(connect(r.ex(), "inproc://url-test-b"));
  BOOST_TEST_REQUIRE(!cec);
  r.run(std::chrono::seconds(1));  // the backlog takes it
  (*l)->close();
  std::array<std::byte, 1> b{};
  const auto rec = r.await(client->read_exact(b));
  BOOST_TEST((rec == errc::peer_closed));
  auto [aec, t] = r.await((*l)->accept());
  BOOST_TEST((aec == errc::closed));
  auto [gone, t2] = r.await(connect(r.ex(), "inproc://url-test-b"));
  BOOST_TEST((gone == errc::peer_failed));
  auto again = listen(r.ex(), "inproc://url-test-b");
  BOOST_TEST(again.has_value(), again.message());
}

BOOST_AUTO_TEST_CASE(inproc_connects_across_threads) {
  runner server_side;
  auto l = listen(server_side.ex(), "inproc://url-test-c");
  BOOST_TEST_REQUIRE(l.has_value(), l.message());
  // Boost.Test's checks are not thread-safe: the other thread only
  // records its results, checked here after join().
  std::error_code connect_ec, write_ec;
  std::thread other([&] {
    runner client_side;
    auto [ec, t] = client_side.await(connect(client_side.ex(), "inproc://url-test-c"));
    connect_ec = ec;
    if (ec) return;
    std::array<char, 2> hi{'h', 'i'};
    const asio::const_buffer buf(hi.data(), hi.size());
    write_ec = client_side.await(t->write(std::span(&buf, 1)));
  });
  auto [aec, server] = server_side.await((*l)->accept());
  std::array<std::byte, 2> in{};
  std::error_code read_ec = aec;
  if (!aec) read_ec = server_side.await(server->read_exact(in));
  other.join();
  BOOST_TEST(!connect_ec, connect_ec.message());
  BOOST_TEST(!write_ec, write_ec.message());
  BOOST_TEST(!aec, aec.message());
  BOOST_TEST(!read_ec, read_ec.message());
  BOOST_TEST((in[0] == std::byte{'h'} && in[1] == std::byte{'i'}));
}

BOOST_AUTO_TEST_CASE(ucx_url_listens_and_connects) {
  ::setenv("UCX_TLS", "tcp", 0);
  runner r;
  auto l = listen(r.ex(), "ucx://127.0.0.1:0");
  if (!l) {
    BOOST_TEST((l.code() == errc::peer_failed));
    BLOBPIPE_SKIP("UCX cannot listen here: " + l.message());
  }
  BOOST_TEST((*l)->port() != 0);
  auto [cec, client] = r.await(connect(r.ex(), (*l)->url()));
  BOOST_TEST_REQUIRE(!cec, cec.message());
  auto [aec, server] = r.await((*l)->accept());
  BOOST_TEST_REQUIRE(!aec, aec.message());
  BOOST_TEST(client->peer_address() == (*l)->url());
  BOOST_TEST(server->peer_address().starts_with("ucx://127.0.0.1:"));
  BOOST_TEST(r.await(ping(*client, *server)));
  BOOST_TEST((listen(r.ex(), "ucx://[::1]:0").code() == errc::invalid_argument));
}
