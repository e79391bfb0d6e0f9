// One end of the two-host test (test/two_hosts.sh): a trainer that accepts
// resend-session connections on a real address, or a rollout worker that
// streams to one. Both run the code users run between machines:
// tcp::listen / tcp::connect, sender::start(connect_fn), consumer::start.
//
//   two_host_peer consume LISTEN_ADDR PORT BLOBS      prints "ready" once listening
//   two_host_peer produce CONNECT_ADDR PORT BLOBS [KILLS]
//
// The consumer exits 0 once every blob arrived exactly once and
// byte-identical (delivery_checker) and the sender closed; the producer
// exits 0 once shutdown() confirmed every blob delivered. With KILLS, the
// producer's first KILLS connections are cut after a varying number of
// frames, so the resend path runs over the real network too. Each side
// prints its peak RSS.
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "test/reliability_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;
using namespace std::chrono_literals;

namespace {

long rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

int consume(const std::string& addr, std::uint16_t port, std::uint64_t n) {
  runner r;
  auto lis = tcp::listen(r.ex(), port, addr);
  if (!lis) {
    std::cerr << "consume: " << lis.message() << "\n";
    return 2;
  }
  std::cout << "ready" << std::endl;
  auto log = std::make_shared<delivery_log>();
  delivery_checker check;
  check.scale = 10;
  int connections = 0;
  std::error_code last_end;
  auto trainer = [&]() -> asio::awaitable<void> {
    consumer_options copt;
    copt.delivered = log;
    copt.stall_timeout = 10s;  // a peer that vanishes mid-blob does not hang us
    while (check.completed.size() < n) {
      auto [aec, t] = co_await lis->accept();
      if (aec) break;
      ++connections;
      auto [ec, c] = co_await consumer::start(std::move(t), copt);
      if (ec) continue;
      for (;;) {
        auto ev = co_await c.next();
        if (ev.kind == event_kind::end_of_stream) last_end = ev.error;
        if (!check.on(&c, ev)) break;
      }
    }
  };
  r.spawn(trainer());
  const bool done = r.run(std::chrono::seconds(300));
  std::cout << "consumer: " << check.completed.size() << " of " << n << " blobs, "
            << connections << " connections, " << check.attempts_voided
            << " attempts voided by resets, peak RSS " << rss_kib() << " KiB" << std::endl;
  if (!done) std::cerr << "consumer: did not finish in 300 s\n";
  if (!check.all_once(n)) std::cerr << "consumer: " << check.first_problem << "\n";
  return done && check.all_once(n) ? 0 : 1;
}

int produce(const std::string& addr, std::uint16_t port, std::uint64_t n, int kills) {
  runner r;
  int made = 0;
  connect_fn connect = [&]() -> asio::awaitable<accept_result> {
    auto [ec, t] = co_await tcp::connect(r.ex(), addr, port);
    if (ec || made >= kills) co_return accept_result{ec, std::move(t)};
    const std::uint64_t at = 200 + (static_cast<std::uint64_t>(made++) * 7919u) % 3000u;
    co_return accept_result{std::error_code{},
                            std::make_unique<kill_switch>(std::move(t), at)};
  };
  std::error_code start_ec, ec, shut;
  sender_stats st;
  auto worker = [&]() -> asio::awaitable<void> {
    sender_options opt;
    opt.chunk_bytes = 1024;
    opt.stall_timeout = 10s;
    opt.resend.max_attempts = 20;
    auto [sec, s] = co_await sender::start(connect, opt);
    start_ec = sec;
    if (sec) co_return;
    for (std::uint64_t i = 0; i < n && !ec; ++i) {
      auto spec = make_blob(i, 10);
      ec = co_await send_blob(s, spec);
    }
    shut = co_await s.shutdown();
    st = s.stats();
  };
  r.spawn(worker());
  const bool done = r.run(std::chrono::seconds(300));
  std::cout << "producer: " << n << " blobs, " << st.reconnects << " reconnects, "
            << st.blobs_resent << " resent, peak RSS " << rss_kib() << " KiB" << std::endl;
  for (auto e : {start_ec, ec, shut})
    if (e) std::cerr << "producer: " << e.message() << "\n";
  return done && !start_ec && !ec && !shut ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::cerr << "usage: two_host_peer consume|produce ADDR PORT BLOBS [KILLS]\n";
    return 2;
  }
  const std::string mode = argv[1], addr = argv[2];
  const auto port = static_cast<std::uint16_t>(std::atoi(argv[3]));
  const auto n = std::strtoull(argv[4], nullptr, 10);
  if (mode == "consume") return consume(addr, port, n);
  if (mode == "produce") return produce(addr, port, n, argc > 5 ? std::atoi(argv[5]) : 0);
  std::cerr << "two_host_peer: unknown mode " << mode << "\n";
  return 2;
}
