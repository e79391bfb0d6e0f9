// Byte transports (blobpipe/transport/transport.hpp, loopback.hpp, tcp.hpp,
// ucx.hpp): the same behaviour on every link of all_links() (loopback, TCP
// and the five UCX configurations): bytes whole and in order, gathered
// writes, exact reads straight into the destination, bulk payloads landed
// where the reader names (and fetched in parallel where the transport
// allows), close wakes everyone. UCX-only cases are in
// ucx_transport_test.cpp.
#define BOOST_TEST_MODULE transport
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <asio/detached.hpp>

#include "test/pipeline_fixture.hpp"
#include "test/skip.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

const std::vector<link_kind> both = all_links();

std::vector<std::byte> pattern(std::size_t n, std::size_t seed) {
  std::vector<std::byte> v(n);
  for (std::size_t j = 0; j < n; ++j) v[j] = static_cast<std::byte>((j * 7 + seed) & 0xff);
  return v;
}

/// Reads exactly out.size() bytes of plain stream with read_some.
asio::awaitable<std::error_code> read_all(transport& t, std::span<std::byte> out,
                                          std::size_t* reads = nullptr) {
  std::vector<std::byte> buf(64 << 10);
  for (std::size_t done = 0; done < out.size();) {
    auto [ec, got] = co_await t.read_some(buf);
    if (ec) co_return ec;
    if (got.bulk_bytes != 0 || done + got.bytes > out.size())
      co_return make_error_code(errc::protocol_violation);
    std::memcpy(out.data() + done, buf.data(), got.bytes);
    done += got.bytes;
    if (reads) ++*reads;
  }
  co_return std::error_code{};
}

}  // namespace

BOOST_AUTO_TEST_CASE(transport_delivers_gathered_writes_whole_and_in_order) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      const std::string p1 = "hello, ", p2 = "bytes", p3 = "; and more";
      std::vector<std::byte> got(p1.size() + p2.size() + p3.size());
      auto send = [&]() -> asio::awaitable<void> {
        const std::array<asio::const_buffer, 2> bufs{asio::buffer(p1), asio::buffer(p2)};
        BLOBPIPE_CO_CHECK(a->write(bufs));
        const std::array<asio::const_buffer, 1> more{asio::buffer(p3)};
        BLOBPIPE_CO_CHECK(a->write(more));
      };
      auto receive = [&]() -> asio::awaitable<void> { BLOBPIPE_CO_CHECK(read_all(*b, got)); };
      r.spawn(send());
      r.spawn(receive());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST(std::memcmp(got.data(), "hello, bytes; and more", got.size()) == 0);
    }
  }
}

// A large payload read with read_exact lands in the destination whole, in
// one call, after a read_some that took only what came before it.
BOOST_AUTO_TEST_CASE(read_exact_lands_the_next_bytes_in_the_destination) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      const auto head = pattern(100, 1), body = pattern(3 << 20, 2);
      std::vector<std::byte> got_head(head.size()), got_body(body.size());
      auto send = [&]() -> asio::awaitable<void> {
        const std::array<asio::const_buffer, 1> h{asio::buffer(head)};
        BLOBPIPE_CO_CHECK(a->write(h));
        // Held until the head was read, so read_some cannot take body bytes.
        co_await yield_n(50);
        const std::array<asio::const_buffer, 1> bb{asio::buffer(body)};
        BLOBPIPE_CO_CHECK(a->write(bb));
      };
      auto receive = [&]() -> asio::awaitable<void> {
        BLOBPIPE_CO_CHECK(read_all(*b, got_head));
        BLOBPIPE_CO_CHECK(b->read_exact(got_body));
      };
      r.spawn(send());
      r.spawn(receive());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((got_head == head));
      BOOST_TEST((got_body == body));
    }
  }
}

// write_bulk: a header and a payload. A message transport (UCX) delivers
// the header through read_some and announces the payload (bulk_bytes),
// which post_read lands where the reader names, several in flight at once
// (read_window); a byte stream delivers both as plain bytes. Empty and
// already-waited receipts are invalid_argument.
BOOST_AUTO_TEST_CASE(bulk_payloads_land_intact_and_overlap_where_allowed) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      constexpr int messages = 6;
      std::vector<std::vector<std::byte>> sent(messages), got(messages);
      for (int i = 0; i < messages; ++i) sent[i] = pattern(300000 + std::size_t(i) * 1000, i);
      const std::size_t window = std::min<std::size_t>(b->read_window(), 4);
      std::size_t most_outstanding = 0, bulk_seen = 0;
      std::error_code empty_ec, second_ec;
      auto send = [&]() -> asio::awaitable<void> {
        for (int i = 0; i < messages; ++i) {
          const std::array<std::byte, 8> header{std::byte(i), std::byte{0xAA}};
          const std::array<asio::const_buffer, 1> payload{asio::buffer(sent[i])};
          BLOBPIPE_CO_CHECK(a->write_bulk(header, payload));
        }
      };
      auto receive = [&]() -> asio::awaitable<void> {
        std::deque<payload_receipt> posted;
        std::vector<std::byte> buf(64);
        for (int i = 0; i < messages; ++i) {
          auto [ec, rd] = co_await b->read_some(std::span(buf).first(64));
          BOOST_TEST_REQUIRE(!ec);
          // A byte stream may deliver fewer header bytes at once.
          std::size_t have = rd.bytes;
          while (have < 8 && rd.bulk_bytes == 0) {
            auto [ec2, more] = co_await b->read_some(std::span(buf).subspan(have, 64 - have));
            BOOST_TEST_REQUIRE(!ec2);
            have += more.bytes;
            rd.bulk_bytes = more.bulk_bytes;
          }
          BOOST_TEST((buf[0] == std::byte(i)));
          got[i].resize(sent[i].size());
          std::span<std::byte> dest(got[i]);
          if (have > 8) {  // a stream: payload bytes came with the header
            std::memcpy(dest.data(), buf.data() + 8, have - 8);
            dest = dest.subspan(have - 8);
          }
          if (rd.bulk_bytes != 0) {
            ++bulk_seen;
            BOOST_TEST(rd.bulk_bytes == sent[i].size());
          }
          posted.push_back(b->post_read(dest));
          most_outstanding = std::max(most_outstanding, posted.size());
          while (posted.size() >= window) {
            auto oldest = std::move(posted.front());
            posted.pop_front();
            BLOBPIPE_CO_CHECK(oldest.wait());
            second_ec = co_await oldest.wait();
          }
        }
        while (!posted.empty()) {
          BLOBPIPE_CO_CHECK(posted.front().wait());
          posted.pop_front();
        }
        empty_ec = co_await payload_receipt{}.wait();
      };
      r.spawn(send());
      r.spawn(receive());
      BOOST_TEST_REQUIRE(r.run());
      for (int i = 0; i < messages; ++i) BOOST_TEST((got[i] == sent[i]), "message " << i);
      BOOST_TEST(bulk_seen == (is_ucx(l) ? std::size_t(messages) : 0u));
      BOOST_TEST(most_outstanding == (is_ucx(l) ? 4u : 1u));
      BOOST_TEST((empty_ec == errc::invalid_argument));
      BOOST_TEST((second_ec == errc::invalid_argument));
    }
  }
}

BOOST_AUTO_TEST_CASE(close_wakes_pending_read_on_both_ends) {
  for (link_kind l : both) {
    BOOST_TEST_CONTEXT(link_name(l)) {
      runner r;
      auto [a, b] = r.await(raw_pair(l));
      std::error_code mine, theirs;
      std::vector<std::byte> buf(64);
      auto wait_a = [&]() -> asio::awaitable<void> {
        auto [ec, got] = co_await a->read_some(buf);
        mine = ec;
      };
      std::vector<std::byte> buf2(64);
      auto wait_b = [&]() -> asio::awaitable<void> {
        auto [ec, got] = co_await b->read_some(buf2);
        theirs = ec;
      };
      auto closer = [&]() -> asio::awaitable<void> {
        co_await yield_n(10);
        a->close();
      };
      r.spawn(wait_a());
      r.spawn(wait_b());
      r.spawn(closer());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((mine == errc::closed));
      BOOST_TEST((theirs == errc::peer_closed));
      BOOST_TEST(!a->is_open());
      std::error_code after;
      auto late = [&]() -> asio::awaitable<void> {
        const std::array<asio::const_buffer, 1> one{asio::buffer("x", 1)};
        after = co_await a->write(one);
      };
      r.spawn(late());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((after == errc::closed));
      // b was not closed by its user: what it does next still says the
      // peer ended the connection, not `closed`.
      std::error_code their_write, their_read;
      auto late_b = [&]() -> asio::awaitable<void> {
        const std::array<asio::const_buffer, 1> one{asio::buffer("x", 1)};
        their_write = co_await b->write(one);
        auto [ec, got] = co_await b->read_some(buf2);
        their_read = ec;
      };
      r.spawn(late_b());
      BOOST_TEST_REQUIRE(r.run());
      BOOST_TEST((their_write == errc::peer_closed), their_write.message());
      BOOST_TEST((their_read == errc::peer_closed), their_read.message());
    }
  }
}

// The two ends of an in-process pair on two threads, each running its own
// io_context: bytes arrive intact, and a close on one thread wakes a read
// waiting on the other.
BOOST_AUTO_TEST_CASE(loopback_ends_on_two_threads_move_bytes_and_close) {
  asio::io_context ctx_a, ctx_b;
  auto [a, b] = loopback::make_pair(ctx_a.get_executor(), ctx_b.get_executor());
  const auto sent = pattern(5 << 20, 3);
  std::vector<std::byte> got(sent.size());
  std::error_code write_ec, read_ec, closed_ec;
  std::atomic<bool> read_done{false};
  asio::co_spawn(ctx_a, [&]() -> asio::awaitable<void> {
    for (std::size_t off = 0; off < sent.size(); off += 1 << 20) {
      const std::array<asio::const_buffer, 1> part{
          asio::buffer(sent.data() + off, std::min<std::size_t>(1 << 20, sent.size() - off))};
      write_ec = co_await a->write(part);
      if (write_ec) break;
    }
  }, asio::detached);
  asio::co_spawn(ctx_b, [&]() -> asio::awaitable<void> {
    read_ec = co_await b->read_exact(got);
    read_done = true;
    std::array<std::byte, 64> more;
    auto [ec, n] = co_await b->read_some(more);  // until a closes
    closed_ec = ec;
  }, asio::detached);
  std::thread tb([&] { ctx_b.run(); });
  ctx_a.run();  // the writes
  while (!read_done) std::this_thread::yield();
  a->close();  // from this thread, while b waits (or is about to) on the other
  tb.join();
  BOOST_TEST(!write_ec);
  BOOST_TEST(!read_ec);
  BOOST_TEST((got == sent));
  BOOST_TEST((closed_ec == errc::peer_closed));
}

BOOST_AUTO_TEST_CASE(listen_rejects_bad_address) {
  asio::io_context ctx;
  auto l = tcp::listen(ctx.get_executor(), 0, "not-an-address");
  BOOST_TEST((l.code() == errc::invalid_argument));
}

namespace {

/// net.core.wmem_max or rmem_max, bytes; 0 where unreadable.
std::uint64_t sysctl_bytes(const char* path) {
  std::ifstream in(path);
  std::uint64_t v = 0;
  return (in >> v) ? v : 0;
}

std::uint16_t port_of(const std::string& url) {
  return static_cast<std::uint16_t>(std::stoul(url.substr(url.rfind(':') + 1)));
}

std::uint16_t port_of(const sockaddr_storage& a) {
  return a.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port)
                                : ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
}

/// The descriptor of this process's TCP socket from port `local` to port
/// `peer` (the transports hide theirs); -1 if none.
int socket_between(std::uint16_t local, std::uint16_t peer) {
  for (const auto& f : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(f.path().filename().string());
    sockaddr_storage me{}, them{};
    socklen_t n1 = sizeof me, n2 = sizeof them;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &n1) != 0 ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&them), &n2) != 0)
      continue;
    if ((me.ss_family == AF_INET || me.ss_family == AF_INET6) && port_of(me) == local &&
        port_of(them) == peer)
      return fd;
  }
  return -1;
}

/// SO_SNDBUF and SO_RCVBUF of both sockets of a TCP pair made with `opt`:
/// {connected send, connected receive, accepted send, accepted receive}.
std::array<int, 4> tcp_pair_buffers(transport_options opt) {
  runner r;
  auto [a, b] = r.await(raw_pair(link_kind::tcp, opt));
  const auto listen_port = port_of(a->peer_address()), client_port = port_of(b->peer_address());
  std::array<int, 4> out{};
  const std::array<int, 2> fds{socket_between(client_port, listen_port),
                               socket_between(listen_port, client_port)};
  for (std::size_t i = 0; i < 2; ++i) {
    BOOST_REQUIRE(fds[i] >= 0);
    socklen_t n = sizeof(int);
    BOOST_REQUIRE(getsockopt(fds[i], SOL_SOCKET, SO_SNDBUF, &out[2 * i], &n) == 0);
    BOOST_REQUIRE(getsockopt(fds[i], SOL_SOCKET, SO_RCVBUF, &out[2 * i + 1], &n) == 0);
  }
  return out;
}

const std::uint64_t wmem_max = sysctl_bytes("/proc/sys/net/core/wmem_max");
const std::uint64_t rmem_max = sysctl_bytes("/proc/sys/net/core/rmem_max");

}  // namespace

// transport_options::socket_buffer_bytes: asked of both sockets where the
// system grants the whole size (Linux reports twice the size asked).
BOOST_AUTO_TEST_CASE(tcp_sockets_ask_for_the_buffer_size_the_system_grants) {
  constexpr std::uint32_t odd_size = (1u << 20) + 12 * 1024;  // no autotuned value
  if (std::min(wmem_max, rmem_max) < odd_size)
    BLOBPIPE_SKIP("net.core.wmem_max " << wmem_max << " or rmem_max " << rmem_max << " is below "
                                       << odd_size << " bytes");
  transport_options opt;
  opt.socket_buffer_bytes = odd_size;
  for (int got : tcp_pair_buffers(opt)) BOOST_TEST(got == 2 * static_cast<int>(odd_size));
}

// A size above the system's maximum, like 0 (the default), leaves
// autotuning: the buffers are what a socket never asked gets, not the
// system's capped maximum.
BOOST_AUTO_TEST_CASE(tcp_sockets_keep_autotuning_above_the_system_maximum_and_at_0) {
  BOOST_TEST(transport_options{}.socket_buffer_bytes == 0u);
  if (wmem_max == 0 || rmem_max == 0 || std::max(wmem_max, rmem_max) >= (1u << 30))
    BLOBPIPE_SKIP("net.core.wmem_max " << wmem_max << " or rmem_max " << rmem_max
                                       << " unreadable or at least 1 GiB");
  transport_options never, above;
  never.socket_buffer_bytes = 0;
  above.socket_buffer_bytes = static_cast<std::uint32_t>(std::max(wmem_max, rmem_max) + 4096);
  const auto autotuned = tcp_pair_buffers(never);
  BOOST_TEST(autotuned[0] != 2 * static_cast<int>(wmem_max));
  BOOST_TEST(autotuned[1] != 2 * static_cast<int>(rmem_max));
  const auto got = tcp_pair_buffers(above);
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_TEST(got[i] == autotuned[i], "buffer " << i);
}
