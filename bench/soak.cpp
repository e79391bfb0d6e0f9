// Endurance soak (bench/soak.sh; never a test): a million small blobs
// through a resend session over TCP, the trainer in one process and the
// rollout worker in another. The trainer checks every blob once and
// byte-identical with constant memory (a bitmap sized up front) and prints
// its resident set size as it goes, so a leak shows as a rising line; it
// fails (exit 1) when its RSS at the end exceeds its RSS after the warm-up
// by more than RSS_BOUND_KIB.
//
//   soak consume PORT BLOBS [CUT_EVERY [RSS_BOUND_KIB]]
//                              trainer; closes each connection after
//                              CUT_EVERY blobs (resends); RSS bound
//                              default 16384 KiB
//   soak produce PORT BLOBS    rollout worker
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/pipeline.hpp"

using namespace blobpipe;
using namespace std::chrono_literals;

namespace {

long rss_kib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

tag_t tag_of(std::uint64_t i) {
  tag_t t{};
  t[0] = std::byte{'s'};
  std::memcpy(t.data() + 8, &i, 8);
  return t;
}

std::uint64_t index_of(const tag_t& t) {
  std::uint64_t i;
  std::memcpy(&i, t.data() + 8, 8);
  return i;
}

/// Blob i's one entry: 8..71 int32 values derived from i.
std::vector<std::int32_t> payload(std::uint64_t i) {
  std::vector<std::int32_t> v(8 + i % 64);
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<std::int32_t>(i * 31 + k);
  return v;
}

/// Default RSS_BOUND_KIB: what the trainer may grow between the warm-up
/// and the end. Its memory is meant to be constant (the bitmap is made up
/// front, the delivery log's window is fixed); this leaves room for the
/// allocator's noise, and a leak of 16 bytes per blob over the default
/// million blobs exceeds it.
constexpr long default_rss_bound_kib = 16 << 10;

int consume(std::uint16_t port, std::uint64_t n, std::uint64_t cut_every, long rss_bound_kib) {
  asio::io_context ctx;
  auto lis = tcp::listen(ctx.get_executor(), port);
  if (!lis) {
    std::cerr << "soak consume: " << lis.message() << "\n";
    return 2;
  }
  std::cout << "listening" << std::endl;
  auto log = std::make_shared<delivery_log>();
  std::vector<bool> seen(n);  // the one structure that grows with n, made up front
  std::uint64_t done = 0, bad = 0, duplicates = 0, connections = 0;
  long rss_start = 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto trainer = [&]() -> asio::awaitable<void> {
    consumer_options copt;
    copt.delivered = log;
    copt.stall_timeout = 30s;
    while (done < n) {
      auto [aec, t] = co_await lis->accept();
      if (aec) break;
      ++connections;
      auto [ec, c] = co_await consumer::start(std::move(t), copt);
      if (ec) continue;
      std::uint64_t here = 0;
      std::shared_ptr<const received_entry> entry;
      for (;;) {
        auto ev = co_await c.next();
        if (ev.kind == event_kind::end_of_stream) break;
        if (ev.kind == event_kind::entry_ready) entry = ev.entry;
        if (ev.kind != event_kind::blob_complete) continue;
        const auto i = index_of(ev.tag);
        const auto want = payload(i);
        if (i >= n || !entry || entry->view.bytes.size() != want.size() * 4 ||
            std::memcmp(entry->view.bytes.data(), want.data(), want.size() * 4) != 0)
          ++bad;
        else if (seen[i])
          ++duplicates;
        else
          seen[i] = true, ++done;
        entry.reset();
        // "Start" after a warm-up of 1%: the delivery log's window (4096
        // tags) and the allocator's pools have filled by then.
        if (done == std::max<std::uint64_t>(n / 100, 1) && rss_start == 0) {
          rss_start = rss_kib();
          std::cout << "rss start " << rss_start << " KiB (after " << done << " blobs)"
                    << std::endl;
        }
        if (done % (n / 10 ? n / 10 : 1) == 0)
          std::cout << "  " << done << " blobs, rss " << rss_kib() << " KiB" << std::endl;
        if (cut_every && ++here == cut_every && done < n) {
          c.close();  // the sender reconnects and resends what was not acknowledged
        }
      }
      duplicates += c.stats().duplicates_dropped;
    }
  };
  asio::co_spawn(ctx, trainer(), asio::detached);
  ctx.run();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long rss_end = rss_kib();
  const bool grew = rss_end - rss_start > rss_bound_kib;
  std::cout << "rss end " << rss_end << " KiB (start " << rss_start << " KiB, growth "
            << rss_end - rss_start << " KiB, bound " << rss_bound_kib << " KiB"
            << (grew ? ": EXCEEDED" : "") << ")\n"
            << done << " of " << n << " blobs once and intact, " << bad << " bad, "
            << connections << " connections, " << duplicates << " duplicates dropped, "
            << static_cast<long>(done / s) << " blobs/s" << std::endl;
  return done == n && bad == 0 && !grew ? 0 : 1;
}

int produce(std::uint16_t port, std::uint64_t n) {
  asio::io_context ctx;
  auto ex = ctx.get_executor();
  connect_fn connect = [ex, port]() { return tcp::connect(ex, "127.0.0.1", port); };
  std::error_code failed;
  sender_stats st;
  auto worker = [&]() -> asio::awaitable<void> {
    sender_options opt;
    opt.stall_timeout = 30s;
    opt.resend.unacked_bytes = 16 << 20;
    opt.resend.max_attempts = 50;
    auto [ec, s] = co_await sender::start(connect, opt);
    if (ec) {
      failed = ec;
      co_return;
    }
    for (std::uint64_t i = 0; i < n && !failed; ++i) {
      const auto v = payload(i);
      auto w = s.open_blob(tag_of(i));
      auto val = value::tensor(v);
      failed = co_await w.emit("x", std::move(val));
      if (!failed) failed = co_await w.finish();
    }
    if (!failed) failed = co_await s.shutdown();
    st = s.stats();
  };
  asio::co_spawn(ctx, worker(), asio::detached);
  ctx.run();
  std::cout << "producer: " << st.reconnects << " reconnects, " << st.blobs_resent
            << " resent, rss " << rss_kib() << " KiB" << (failed ? ", " + failed.message() : "")
            << std::endl;
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: soak consume PORT BLOBS [CUT_EVERY [RSS_BOUND_KIB]]\n"
                 "       soak produce PORT BLOBS\n";
    return 2;
  }
  const std::string mode = argv[1];
  const auto port = static_cast<std::uint16_t>(std::atoi(argv[2]));
  const auto n = std::strtoull(argv[3], nullptr, 10);
  if (mode == "consume")
    return consume(port, n, argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 0,
                   argc > 5 ? std::strtol(argv[5], nullptr, 10) : default_rss_bound_kib);
  if (mode == "produce") return produce(port, n);
  return 2;
}
