// blobpipe frames over UCX, measured the way ucx_perftest measures tag_bw
// and stream_bw: one process receives, another sends `iters` messages of
// `size` bytes with up to `window` sends outstanding, and the sender
// reports bandwidth (MB/s with MB = 2^20 bytes, as ucx_perftest prints it).
// bench/ucx_bench.sh runs it next to ucx_perftest with the same UCX_TLS.
//
//   ucx_bench --server --port 13400 --size 1048576 --iters 2000
//   ucx_bench --client 127.0.0.1 --port 13400 --size 1048576 --iters 2000 --window 8
//
// A message is one blobpipe frame (24-byte header + payload) sent with
// transport::send from one reused source buffer. The receiver takes each
// header and lands the payload with transport::post_read, keeping up to
// --rx-window fetches in flight (rendezvous: straight into the
// destination), as perftest keeps receives posted. Like perftest, every
// payload lands in the same destination buffer; --rx-buffers B spreads
// them over B buffers in turn (a colder cache, as a consumer's fresh entry
// buffers see). After warm-up and after the timed run the receiver answers
// with one empty ack frame, so the time covers delivery, not just handing
// off. UCX settings come from the environment (UCX_TLS, ...), as for
// ucx_perftest.
//
// --pipeline ENTRY_BYTES (1..2^32) runs the whole pipeline instead (blobpipe::sender
// and blobpipe::consumer over the same transport, both with defaults
// otherwise): the client emits entries of ENTRY_BYTES, views of one reused
// source buffer, in blobs of up to 64 entries, cut into data frames of
// --size bytes (sender_options::chunk_bytes), warmup * size bytes first,
// then iters * size; the consumer drops every entry at once. The server
// reports, from the warm-up blob's completion to the last blob's: the
// rate at which entries arrive, as an application sees it.
// --recycle-bytes sets the server's consumer_options::recycle_bytes (0:
// every entry in a fresh buffer); --producers N (client) shares the timed
// bytes among N coroutines emitting blobs at once on the one sender.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/experimental/as_tuple.hpp>

#include "blobpipe/pipeline.hpp"
#include "blobpipe/transport/ucx.hpp"

namespace bp = blobpipe;
using clock_type = std::chrono::steady_clock;
constexpr double mib = 1024.0 * 1024.0;

namespace {

struct args {
  bool server = false;
  std::string host = "127.0.0.1";
  std::uint16_t port = 13400;
  std::size_t size = 1 << 20;  // bytes per message
  std::uint64_t iters = 2000;
  std::uint64_t warmup = 100;
  int window = 8;        // sends outstanding at once
  int rx_window = 16;    // receives outstanding at once (server), as a consumer's
  int rx_buffers = 1;    // destination buffers they land in, in turn (server)
  std::uint64_t entry_bytes = 0;  // --pipeline: bytes per entry; 0: frames only
  std::uint64_t recycle_bytes = bp::default_recycle_bytes;  // --pipeline server
  int producers = 1;  // --pipeline client: coroutines emitting blobs at once
  bp::ucx::options ucx;  // busy_poll from --busy-poll; UCX_* from the environment
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: ucx_bench (--server | --client HOST) [--port P] [--size BYTES]\n"
               "                 [--iters N] [--warmup N] [--window W] [--rx-window W]\n"
               "                 [--rx-buffers B] [--busy-poll US] [--pipeline ENTRY_BYTES]\n"
               "                 [--recycle-bytes B] [--producers N]\n");
  std::exit(2);
}

args parse(int argc, char** argv) {
  args a;
  bool role = false;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    // A whole decimal number in [lo, hi]; anything else is a usage error
    // (not a silent 0, as atoi would read "64M").
    auto number = [&](std::uint64_t lo, std::uint64_t hi) -> std::uint64_t {
      const std::string_view s = next();
      std::uint64_t v = 0;
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc{} || end != s.data() + s.size() || v < lo || v > hi) {
        std::fprintf(stderr, "ucx_bench: %s '%s': not a whole number from %llu to %llu\n",
                     k.c_str(), std::string(s).c_str(), (unsigned long long)lo,
                     (unsigned long long)hi);
        usage();
      }
      return v;
    };
    constexpr std::uint64_t any = std::numeric_limits<std::uint64_t>::max();
    if (k == "--server")
      a.server = role = true;
    else if (k == "--client")
      a.host = next(), role = true;
    else if (k == "--port")
      a.port = static_cast<std::uint16_t>(number(0, 65535));
    else if (k == "--size")
      a.size = number(1, bp::default_max_frame_bytes);
    else if (k == "--iters")
      a.iters = number(1, any);
    else if (k == "--warmup")
      a.warmup = number(0, any);
    else if (k == "--window")
      a.window = static_cast<int>(number(1, 1 << 20));
    else if (k == "--rx-window")
      a.rx_window = static_cast<int>(number(1, 1 << 20));
    else if (k == "--rx-buffers")
      a.rx_buffers = static_cast<int>(number(1, 1 << 20));
    else if (k == "--busy-poll")
      a.ucx.busy_poll = std::chrono::microseconds(number(0, std::uint64_t(1) << 40));
    else if (k == "--pipeline")
      a.entry_bytes = number(1, std::uint64_t(1) << 32);
    else if (k == "--recycle-bytes")
      a.recycle_bytes = number(0, any);
    else if (k == "--producers")
      a.producers = static_cast<int>(number(1, 1024));
    else
      usage();
  }
  if (!role) usage();
  return a;
}

// Receives `n` frames (bulk messages), then acks. Up to `window` payloads
// are in flight at once (transport::post_read), as ucx_perftest keeps a
// window of receives posted; they land in the `dest` buffers in turn.
asio::awaitable<bool> drain(bp::transport& t, std::uint64_t n, std::size_t window,
                            std::vector<std::vector<std::byte>>& dest) {
  std::deque<bp::payload_receipt> inflight;
  auto wait_oldest = [&]() -> asio::awaitable<bool> {
    auto r = std::move(inflight.front());
    inflight.pop_front();
    if (auto ec = co_await r.wait()) {
      std::fprintf(stderr, "server: receive_payload: %s %s\n", ec.message().c_str(),
                   t.last_error().c_str());
      co_return false;
    }
    co_return true;
  };
  window = std::min(window, t.read_window());
  std::array<std::byte, 64> header;
  for (std::uint64_t i = 0; i < n; ++i) {
    auto [ec, got] = co_await t.read_some(header);
    if (ec || got.bytes != bp::frame_header_size || got.bulk_bytes != dest[0].size()) {
      std::fprintf(stderr, "server: read header: %s %s\n", ec.message().c_str(),
                   t.last_error().c_str());
      co_return false;
    }
    inflight.push_back(t.post_read(dest[i % dest.size()]));
    if (inflight.size() >= window && !co_await wait_oldest()) co_return false;
  }
  while (!inflight.empty())
    if (!co_await wait_oldest()) co_return false;
  const std::array<asio::const_buffer, 1> ack{asio::buffer("A", 1)};
  co_return !co_await t.write(ack);
}

asio::awaitable<void> serve_pipeline(const args& a, std::unique_ptr<bp::transport> t, int& rc);
asio::awaitable<void> run_pipeline_client(const args& a, std::unique_ptr<bp::transport> t,
                                          int& rc);

asio::awaitable<void> serve(const args& a, int& rc) {
  auto ex = co_await asio::this_coro::executor;
  auto l = bp::ucx::listen(ex, a.port, "0.0.0.0", a.ucx);
  if (!l) {
    std::fprintf(stderr, "server: %s\n", l.message().c_str());
    co_return;
  }
  auto [ec, t] = co_await l->accept();
  l->close();
  if (ec) co_return;
  if (a.entry_bytes > 0) co_return co_await serve_pipeline(a, std::move(t), rc);
  std::vector<std::vector<std::byte>> dest(a.rx_buffers, std::vector<std::byte>(a.size));
  if (!co_await drain(*t, a.warmup, a.rx_window, dest)) co_return;
  if (!co_await drain(*t, a.iters, a.rx_window, dest)) co_return;
  auto s = bp::ucx::get_stats(*t).value();
  std::printf(
      "server: %llu messages received, %llu payloads by rendezvous (%llu bytes into dest), "
      "%llu eager (%llu bytes copied)\n",
      (unsigned long long)s.messages_received, (unsigned long long)s.rndv_payloads,
      (unsigned long long)s.rndv_bytes, (unsigned long long)s.eager_payloads,
      (unsigned long long)s.eager_bytes);
  // Wait for the client to close first, so its last ack is not cut off.
  std::array<std::byte, 64> end;
  (void)co_await t->read_some(end);
  rc = 0;
}

// Runs the coroutines of `work` at once on this executor and waits for
// all of them: false when one returned false or threw.
asio::awaitable<bool> all_of(std::vector<asio::awaitable<bool>> work) {
  auto ex = co_await asio::this_coro::executor;
  std::size_t running = work.size();
  bool ok = true;
  asio::steady_timer done(ex, asio::steady_timer::time_point::max());
  for (auto& w : work) {
    asio::co_spawn(ex, std::move(w), [&](std::exception_ptr e, bool r) {
      ok = ok && r && !e;
      if (--running == 0) done.cancel();
    });
  }
  if (running > 0) co_await done.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  co_return ok;
}

// Sends frames numbered [next, end) from `src`, `window` coroutines at once
// (each a bulk message: the UCX transport takes concurrent writes, each
// one active message, as ucx_perftest keeps a window of sends).
asio::awaitable<bool> send_some(bp::transport& t, const std::vector<std::byte>& src,
                                std::uint64_t& next, std::uint64_t end, bool& failed) {
  while (next < end && !failed) {
    std::uint64_t id = next++;
    std::array<std::byte, bp::frame_header_size> header;
    bp::encode_frame_header(
        {.type = bp::frame_type::data, .length = std::uint32_t(src.size()), .blob_id = id},
        header);
    const std::array<asio::const_buffer, 1> payload{asio::buffer(src)};
    auto ec = co_await t.write_bulk(header, payload);
    if (ec) {
      std::fprintf(stderr, "client: send: %s %s\n", ec.message().c_str(), t.last_error().c_str());
      failed = true;
    }
  }
  co_return !failed;
}

// One round: `n` frames out, then the receiver's ack back. Seconds taken.
asio::awaitable<double> round(bp::transport& t, const args& a, std::uint64_t n,
                              const std::vector<std::byte>& src, bool& failed) {
  auto start = clock_type::now();
  std::uint64_t next = 0;
  std::vector<asio::awaitable<bool>> senders;
  for (int w = 0; w < a.window; ++w) senders.push_back(send_some(t, src, next, n, failed));
  if (!co_await all_of(std::move(senders))) failed = true;
  std::array<std::byte, 64> ack;
  auto [ec, got] = co_await t.read_some(ack);  // the ack: all n delivered
  if (ec) {
    std::fprintf(stderr, "client: waiting for ack: %s\n", ec.message().c_str());
    failed = true;
  }
  co_return std::chrono::duration<double>(clock_type::now() - start).count();
}

asio::awaitable<void> run_client(const args& a, int& rc) {
  auto ex = co_await asio::this_coro::executor;
  std::unique_ptr<bp::transport> t;
  // The server may still be starting: retry for a while, as a script would.
  for (int attempt = 0; attempt < 100 && !t; ++attempt) {
    auto [ec, c] = co_await bp::ucx::connect(ex, a.host, a.port, {}, a.ucx);
    if (!ec)
      t = std::move(c);
    else {
      asio::steady_timer pause(ex, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::use_awaitable);
    }
  }
  if (!t) {
    std::fprintf(stderr, "client: could not connect to %s:%u\n", a.host.c_str(), a.port);
    co_return;
  }
  if (a.entry_bytes > 0) co_return co_await run_pipeline_client(a, std::move(t), rc);
  std::vector<std::byte> src(a.size, std::byte{0x5a});
  bool failed = false;
  (void)co_await round(*t, a, a.warmup, src, failed);
  double secs = co_await round(*t, a, a.iters, src, failed);
  if (failed) co_return;
  double mb = double(a.size) * double(a.iters) / (1024.0 * 1024.0);
  std::printf("blobpipe-ucx size=%zu iters=%llu window=%d: %.2f MB/s (%.0f msg/s, %.3f s)\n",
              a.size, (unsigned long long)a.iters, a.window, mb / secs, a.iters / secs, secs);
  std::printf("%s\n", bp::ucx::describe(*t).value().c_str());
  t->close();
  rc = 0;
}


// --pipeline, server: a consumer that drops every entry at once and times
// from the warm-up blob's completion to the last blob's.
asio::awaitable<void> serve_pipeline(const args& a, std::unique_ptr<bp::transport> t, int& rc) {
  bp::consumer_options opt;
  opt.max_chunk_bytes = std::uint32_t(a.size);
  opt.recycle_bytes = a.recycle_bytes;
  auto [ec, c] = co_await bp::consumer::start(std::move(t), opt);
  if (ec) {
    std::fprintf(stderr, "server: consumer::start: %s\n", ec.message().c_str());
    co_return;
  }
  clock_type::time_point start, end;
  std::uint64_t blobs = 0, timed_bytes = 0, bytes = 0;
  for (;;) {
    bp::event ev = co_await c.next();
    if (ev.kind == bp::event_kind::entry_ready) {
      bytes += ev.entry->entry.len;  // ev, and the entry, are dropped here
    } else if (ev.kind == bp::event_kind::blob_complete) {
      if (blobs++ == 0) {
        start = clock_type::now();
        bytes = 0;
      } else {
        end = clock_type::now();
        timed_bytes = bytes;
      }
    } else if (ev.kind == bp::event_kind::blob_aborted) {
      std::fprintf(stderr, "server: blob aborted: %s\n", bp::escape(ev.reason).c_str());
      co_return;
    } else {
      if (ev.error) {
        std::fprintf(stderr, "server: %s %s\n", ev.error.message().c_str(), bp::escape(ev.reason).c_str());
        co_return;
      }
      break;
    }
  }
  if (blobs < 2) {
    std::fprintf(stderr, "server: no timed blob arrived\n");
    co_return;
  }
  const double secs = std::chrono::duration<double>(end - start).count();
  const auto st = c.stats();
  std::printf("blobpipe-pipeline entry=%llu chunk=%zu: %.2f MB/s (%llu bytes in %.3f s; %llu "
              "buffers reused, %llu chunks overlapped)\n",
              (unsigned long long)a.entry_bytes, a.size, double(timed_bytes) / mib / secs,
              (unsigned long long)timed_bytes, secs, (unsigned long long)st.buffers_reused,
              (unsigned long long)st.chunks_overlapped);
  rc = 0;
}

// --pipeline, client: `bytes` of entries of entry_bytes in blobs of up to
// 64 entries.
asio::awaitable<bool> emit_bytes(bp::sender& s, const args& a, const std::vector<std::byte>& src,
                                 std::uint64_t bytes) {
  constexpr std::uint64_t entries_per_blob = 64;
  std::uint64_t entries = std::max<std::uint64_t>(1, (bytes + a.entry_bytes - 1) / a.entry_bytes);
  while (entries > 0) {
    auto blob = s.open_blob();
    for (std::uint64_t i = 0; i < entries_per_blob && entries > 0; ++i, --entries) {
      auto v = bp::value::tensor_bytes(src, "uint8", {std::int64_t(src.size())});
      if (auto ec = co_await blob.emit("e" + std::to_string(i), std::move(v))) {
        std::fprintf(stderr, "client: emit: %s\n", ec.message().c_str());
        co_return false;
      }
    }
    if (auto ec = co_await blob.finish()) {
      std::fprintf(stderr, "client: finish: %s\n", ec.message().c_str());
      co_return false;
    }
  }
  co_return true;
}

asio::awaitable<void> run_pipeline_client(const args& a, std::unique_ptr<bp::transport> t,
                                          int& rc) {
  auto [ec, s] = co_await bp::sender::start(std::move(t), {.chunk_bytes = std::uint32_t(a.size)});
  if (ec) {
    std::fprintf(stderr, "client: sender::start: %s\n", ec.message().c_str());
    co_return;
  }
  std::vector<std::byte> src(a.entry_bytes, std::byte{0x5a});
  if (!co_await emit_bytes(s, a, src, a.warmup * a.size)) co_return;
  // The timed bytes, shared out among --producers coroutines.
  const std::uint64_t share = a.iters * a.size / std::uint64_t(a.producers);
  std::vector<asio::awaitable<bool>> producers;
  for (int p = 0; p < a.producers; ++p) producers.push_back(emit_bytes(s, a, src, share));
  if (!co_await all_of(std::move(producers))) co_return;
  if (auto e = co_await s.shutdown()) {
    std::fprintf(stderr, "client: shutdown: %s\n", e.message().c_str());
    co_return;
  }
  rc = 0;
}

}  // namespace

int main(int argc, char** argv) {
  args a = parse(argc, argv);
  // One thread runs it: the concurrency hint lets Asio skip most locking.
  asio::io_context ctx(1);
  int rc = 1;
  if (a.server)
    asio::co_spawn(ctx, serve(a, rc), asio::detached);
  else
    asio::co_spawn(ctx, run_client(a, rc), asio::detached);
  ctx.run();
  return rc;
}
