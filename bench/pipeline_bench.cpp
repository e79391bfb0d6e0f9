// bench/pipeline_bench.cpp — the streaming pipeline against a raw socket.
//
//   bazel run -c opt //bench:pipeline_bench
//
// 1. Throughput: 1 GiB as one blob of 64 x 16 MiB entries, sender and
//    consumer each on its own thread and io_context, over TCP loopback;
//    against two threads doing blocking send/recv of the same bytes in the
//    same 16 MiB pieces. Target: blobpipe >= 0.9x the raw socket.
// 2. Small entries: 64-byte values (float32[16]), 1,000 per blob, as
//    entries/s over TCP and over the in-process loopback transport (which
//    shows the pipeline's own per-entry cost without syscalls).
// 3. Time to first entry: a blob whose first entry is 1 MiB, 16 MiB in all
//    versus 1 GiB in all. Entries stream as they are emitted, so the first
//    one should arrive as fast in both cases. Target: best runs within 1.5x
//    of each other, either way (max / min).
//
// Memory stays small: every sent entry is a view of one reused 16 MiB
// buffer, and the consumer drops each entry as soon as it arrives (its
// window credit goes straight back). Prints PASS/MISS but always exits 0
// unless the pipeline itself fails: a benchmark reports, it never gates
// (CONTRIBUTING.md "Benchmarks"). Runtime: about 20 s on a 2-core VM.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/pipeline.hpp"

namespace {

namespace bp = blobpipe;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t mib = std::size_t{1} << 20;

constexpr std::size_t big_entry_bytes = 16 * mib;
constexpr std::size_t big_total_bytes = 1024 * mib;
constexpr int throughput_reps = 3;
constexpr double target_ratio = 0.9;
// A second blobpipe run with larger data frames shows how much of the gap
// to the raw socket is per-frame cost (one header read per chunk).
constexpr std::uint32_t big_chunk_bytes = 8 * mib;

constexpr std::size_t small_entry_bytes = 64;
constexpr std::size_t small_entries = 100'000;
constexpr std::size_t small_per_blob = 1'000;
constexpr int small_reps = 3;

constexpr std::size_t first_entry_bytes = 1 * mib;
constexpr int ttfe_reps = 7;
constexpr double ttfe_target = 1.5;

double seconds(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void check(std::error_code ec, const char* what) {
  if (ec)
    throw std::runtime_error(std::string(what) + ": " + bp::errc_name(ec) + " (" + ec.message() +
                             ")");
}

// One reused source buffer; every entry sent is a view of its first bytes.
const std::vector<std::byte>& source() {
  static const std::vector<std::byte> buf = [] {
    std::vector<std::byte> b(big_entry_bytes);
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 131 + 7);
    return b;
  }();
  return buf;
}

bp::value bytes_value(std::size_t n) {
  return bp::value::tensor_bytes(std::span(source()).first(n), "uint8",
                                 {static_cast<std::int64_t>(n)});
}

using send_fn = std::function<asio::awaitable<void>(bp::sender&)>;
using recv_fn = std::function<asio::awaitable<void>(bp::consumer&)>;

// Rethrows a coroutine's exception out of io_context::run().
void rethrow(std::exception_ptr e) {
  if (e) std::rethrow_exception(e);
}

// Runs `send` and `recv` over a fresh TCP loopback connection: the
// consumer on its own io_context and thread, the sender on this one.
// `chunk` is the data frame size both ends agree on.
void run_tcp(const send_fn& send, const recv_fn& recv,
             std::uint32_t chunk = bp::default_chunk_bytes) {
  asio::io_context rx, tx;
  auto l = bp::tcp::listen(rx.get_executor(), 0).value();
  const auto port = l.port();
  asio::co_spawn(
      rx,
      [&]() -> asio::awaitable<void> {
        auto [ec, t] = co_await l.accept();
        check(ec, "accept");
        bp::consumer_options opt;
        opt.max_chunk_bytes = chunk;
        auto [ec2, c] = co_await bp::consumer::start(std::move(t), opt);
        check(ec2, "consumer::start");
        co_await recv(c);
      },
      rethrow);
  asio::co_spawn(
      tx,
      [&]() -> asio::awaitable<void> {
        auto [ec, t] = co_await bp::tcp::connect(tx.get_executor(), "127.0.0.1", port);
        check(ec, "connect");
        auto [ec2, s] = co_await bp::sender::start(std::move(t), {.chunk_bytes = chunk});
        check(ec2, "sender::start");
        co_await send(s);
        check(co_await s.shutdown(), "shutdown");
      },
      rethrow);
  std::exception_ptr rx_error;
  std::thread rx_thread([&] {
    try {
      rx.run();
    } catch (...) {
      rx_error = std::current_exception();
    }
  });
  tx.run();
  rx_thread.join();
  rethrow(rx_error);
}

// The same over the in-process loopback transport, on one thread.
void run_loopback(const send_fn& send, const recv_fn& recv) {
  asio::io_context ctx;
  auto [a, b] = bp::loopback::make_pair(ctx.get_executor());
  asio::co_spawn(
      ctx,
      [&, t = std::move(b)]() mutable -> asio::awaitable<void> {
        auto [ec, c] = co_await bp::consumer::start(std::move(t));
        check(ec, "consumer::start");
        co_await recv(c);
      },
      rethrow);
  asio::co_spawn(
      ctx,
      [&, t = std::move(a)]() mutable -> asio::awaitable<void> {
        auto [ec, s] = co_await bp::sender::start(std::move(t));
        check(ec, "sender::start");
        co_await send(s);
        check(co_await s.shutdown(), "shutdown");
      },
      rethrow);
  ctx.run();
}

// Sends blobs of `sizes` entries each (bytes per entry), recording the
// start; the consumer records first-entry and last-blob times and drops
// every entry at once.
struct timings {
  clock_type::time_point start, first_entry, last_blob;
  std::uint64_t entries = 0, bytes = 0;
};

send_fn send_blobs(std::size_t blobs, std::vector<std::size_t> sizes, timings& t) {
  return [blobs, sizes = std::move(sizes), &t](bp::sender& s) -> asio::awaitable<void> {
    t.start = clock_type::now();
    for (std::size_t b = 0; b < blobs; ++b) {
      auto blob = s.open_blob();
      for (std::size_t i = 0; i < sizes.size(); ++i)
        check(co_await blob.emit("e" + std::to_string(i), bytes_value(sizes[i])), "emit");
      check(co_await blob.finish(), "finish");
    }
  };
}

recv_fn drain(timings& t) {
  return [&t](bp::consumer& c) -> asio::awaitable<void> {
    for (;;) {
      bp::event ev = co_await c.next();
      switch (ev.kind) {
        case bp::event_kind::entry_ready:
          if (t.entries++ == 0) t.first_entry = clock_type::now();
          t.bytes += ev.entry->entry.len;
          break;  // ev (and the entry) is dropped here
        case bp::event_kind::blob_complete:
          t.last_blob = clock_type::now();
          break;
        case bp::event_kind::blob_aborted:
          throw std::runtime_error("blob aborted: " + bp::escape(ev.reason));
        case bp::event_kind::end_of_stream:
          check(ev.error, "end of stream");
          co_return;
      }
    }
  };
}

// Two threads, blocking send/recv of `total` bytes in `piece`-byte calls.
double raw_socket_seconds(std::size_t total, std::size_t piece) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 1) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("raw socket: bind/listen failed");
  clock_type::time_point end;
  std::thread rx([&] {
    int c = ::accept(ls, nullptr, nullptr);
    std::vector<std::byte> buf(piece, std::byte{1});  // touched: no page faults while timing
    for (std::size_t got = 0; got < total;) {
      ssize_t n = ::recv(c, buf.data(), std::min(piece, total - got), 0);
      if (n <= 0) break;
      got += static_cast<std::size_t>(n);
    }
    end = clock_type::now();
    ::close(c);
  });
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // as blobpipe's sockets
  if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    throw std::runtime_error("raw socket: connect failed");
  const auto start = clock_type::now();
  for (std::size_t sent = 0; sent < total;) {
    const std::size_t n = std::min(piece, total - sent);
    for (std::size_t off = 0; off < n;) {
      ssize_t w = ::send(s, source().data() + off, n - off, 0);
      if (w <= 0) throw std::runtime_error("raw socket: send failed");
      off += static_cast<std::size_t>(w);
    }
    sent += n;
  }
  ::close(s);
  rx.join();
  ::close(ls);
  return seconds(start, end);
}

void bench_throughput() {
  const std::size_t entries = big_total_bytes / big_entry_bytes;
  const std::vector<std::size_t> sizes(entries, big_entry_bytes);
  double best_raw = 1e9, best_bp = 1e9, best_big_chunk = 1e9;
  for (int rep = 0; rep < throughput_reps; ++rep) {
    best_raw = std::min(best_raw, raw_socket_seconds(big_total_bytes, big_entry_bytes));
    timings t;
    run_tcp(send_blobs(1, sizes, t), drain(t));
    best_bp = std::min(best_bp, seconds(t.start, t.last_blob));
    timings u;
    run_tcp(send_blobs(1, sizes, u), drain(u), big_chunk_bytes);
    best_big_chunk = std::min(best_big_chunk, seconds(u.start, u.last_blob));
  }
  const double gb = static_cast<double>(big_total_bytes) / 1e9;
  const double raw_gbs = gb / best_raw, bp_gbs = gb / best_bp, ratio = bp_gbs / raw_gbs;
  const double big_chunk_gbs = gb / best_big_chunk;
  std::printf("[1] throughput: 1 GiB as one blob of %zu x %zu MiB entries, best of %d\n", entries,
              big_entry_bytes / mib, throughput_reps);
  std::printf("    raw socket    %7.2f GB/s  (%.1f ms; blocking send/recv, 2 threads)\n", raw_gbs,
              best_raw * 1e3);
  std::printf("    blobpipe tcp  %7.2f GB/s  (%.1f ms; sender and consumer on 2 threads)\n",
              bp_gbs, best_bp * 1e3);
  std::printf("    blobpipe/raw  %7.2fx      target >= %.2fx: %s\n", ratio, target_ratio,
              ratio >= target_ratio ? "PASS" : "MISS");
  std::printf("    chunk %zu MiB   %7.2f GB/s  (%.2fx raw; the default chunk is %u MiB)\n",
              big_chunk_bytes / mib, big_chunk_gbs, big_chunk_gbs / raw_gbs,
              bp::default_chunk_bytes >> 20);
}

void bench_small_entries() {
  const std::size_t blobs = small_entries / small_per_blob;
  const std::vector<std::size_t> sizes(small_per_blob, small_entry_bytes);
  double best_tcp = 1e9, best_loop = 1e9;
  for (int rep = 0; rep < small_reps; ++rep) {
    timings t;
    run_tcp(send_blobs(blobs, sizes, t), drain(t));
    best_tcp = std::min(best_tcp, seconds(t.start, t.last_blob));
    timings u;
    run_loopback(send_blobs(blobs, sizes, u), drain(u));
    best_loop = std::min(best_loop, seconds(u.start, u.last_blob));
  }
  const double n = static_cast<double>(small_entries);
  std::printf("[2] small entries: %zu x %zu B in %zu blobs of %zu, best of %d\n", small_entries,
              small_entry_bytes, blobs, small_per_blob, small_reps);
  std::printf("    tcp           %10.0f entries/s  (%.1f ms; 2 threads)\n", n / best_tcp,
              best_tcp * 1e3);
  std::printf("    loopback      %10.0f entries/s  (%.1f ms; in-process, 1 thread)\n",
              n / best_loop, best_loop * 1e3);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

void bench_first_entry() {
  auto blob_of = [](std::size_t total) {
    return std::vector<std::size_t>(total / first_entry_bytes, first_entry_bytes);
  };
  std::vector<double> small, large, large_total;
  auto run_small = [&] {
    timings s;
    run_tcp(send_blobs(1, blob_of(16 * mib), s), drain(s));
    small.push_back(seconds(s.start, s.first_entry));
  };
  auto run_large = [&] {
    timings l;
    run_tcp(send_blobs(1, blob_of(big_total_bytes), l), drain(l));
    large.push_back(seconds(l.start, l.first_entry));
    large_total.push_back(seconds(l.start, l.last_blob));
  };
  // Alternate which goes first: a run right after a 1 GiB one meets a
  // different machine (page cache, allocator) than one after a small run.
  for (int rep = 0; rep < ttfe_reps; ++rep) {
    if (rep % 2 == 0) {
      run_small();
      run_large();
    } else {
      run_large();
      run_small();
    }
  }
  // Judged on the best run: on a shared machine single runs vary by a few
  // milliseconds either way, and the best run is the pipeline's own floor.
  // Either way round: a 1 GiB blob whose first entry came 3x sooner is as
  // far from "as fast" as one 3x later.
  const double lo = std::min(best(large), best(small)), hi = std::max(best(large), best(small));
  const double ratio = hi / lo;
  std::printf("[3] time to first entry: first entry %zu MiB (entries of 1 MiB), best and "
              "median of %d\n",
              first_entry_bytes / mib, ttfe_reps);
  std::printf("    blob of 16 MiB  %7.3f ms  (median %.3f ms)\n", best(small) * 1e3,
              median(small) * 1e3);
  std::printf("    blob of 1 GiB   %7.3f ms  (median %.3f ms; whole blob %.1f ms)\n",
              best(large) * 1e3, median(large) * 1e3, median(large_total) * 1e3);
  std::printf("    max / min       %7.2fx     target <= %.1fx: %s\n", ratio, ttfe_target,
              ratio <= ttfe_target ? "PASS" : "MISS");
}

}  // namespace

int main() {
  std::printf("pipeline_bench: blobpipe streaming over TCP loopback, %u hardware threads\n",
              std::thread::hardware_concurrency());
  std::printf("    chunk %u KiB, consumer window %llu MiB (defaults)\n",
              bp::default_chunk_bytes >> 10,
              static_cast<unsigned long long>(bp::default_window_bytes >> 20));
  std::fflush(stdout);
  try {
    source();  // fill the source buffer before any clock starts
    const auto t0 = clock_type::now();
    bench_throughput();
    std::fflush(stdout);
    bench_small_entries();
    std::fflush(stdout);
    bench_first_entry();
    std::printf("total %.1f s\n", seconds(t0, clock_type::now()));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
