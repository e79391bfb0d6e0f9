// bench/cluster_bench.cpp — fan-in: N senders (coroutines) into one
// blobpipe::server over TCP loopback, against one sender over one
// connection in the same run, with RL sample mixes; then the entry latency
// (emit -> entry_ready) under a slow consumer. Reports, never gates.
//
//   bazel/bazelw run -c opt //bench:cluster_bench -- [--senders 16]
//       [--samples 8192] [--seq-len 4096] [--slow-us 200] [--budget-mb 256]
//       [--stream-kb 4096] [--threads 1] [--process-runs R] [--one-phase]
//
// --threads N: the server's receive threads (server_options::threads) in
// every phase. --process-runs R: instead, the server alone in this process
// and its senders in other processes (this binary run again with --send),
// R interleaved rounds of five phases: 1 sender on 1 connection (1
// receive thread), --senders senders (1 receive thread), --senders
// senders on --threads receive threads (2 when --threads is 1), and the
// raw-socket floor with 1 and --senders connections (--send-raw: the same
// bytes, one send() per entry, read by a plain epoll loop). Each phase
// prints bytes/s (first to last entry) and the server's CPU per byte
// (getrusage of this process: the server only; with receive threads,
// split by thread); the medians over the rounds end the output
// (bench/cluster_bench.sh runs 5 rounds). --one-phase: one server phase
// with --senders sender processes on --threads receive threads, alone.
//
// A sample is five entries as RL sends them: int64 token ids [T], float32
// logprobs [T], bool mask [T], a float32 reward and 256 bytes of pickled
// meta (T = --seq-len). Every phase sends --samples samples in all; the
// consumer drops each entry at once, except in the slow phase, where it
// waits --slow-us microseconds per entry before taking the next.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include "blobpipe/cluster/server.hpp"
#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "blobpipe/pipeline/producer.hpp"
#include "blobpipe/transport/url.hpp"

namespace {

using clock = std::chrono::steady_clock;

struct config {
  std::size_t senders = 16;
  std::size_t samples = 8192;
  std::size_t seq_len = 4096;
  std::uint64_t slow_us = 200;
  std::uint64_t budget_mb = 256;
  std::uint64_t stream_kb = blobpipe::credit_pool::default_stream_bytes >> 10;
  std::size_t threads = 1;        // the server's receive threads
  std::size_t process_runs = 0;   // > 0: senders in other processes, this many rounds
  bool one_phase = false;         // --one-phase: one process phase only (for a profiler)
};

struct sample_data {
  std::vector<std::int64_t> ids;
  std::vector<float> logprobs;
  std::vector<std::uint8_t> mask;
  float reward = 0.5f;
  std::vector<std::byte> meta;
  explicit sample_data(std::size_t t) : ids(t, 7), logprobs(t, -1.5f), mask(t, 1), meta(256) {}
  std::uint64_t bytes() const {
    return ids.size() * 8 + logprobs.size() * 4 + mask.size() + 4 + meta.size();
  }
};

asio::awaitable<void> send_share(std::string url, const sample_data& s, std::size_t first,
                                 std::size_t count, int& failures) {
  auto ex = co_await asio::this_coro::executor;
  auto [ec, t] = co_await blobpipe::connect(ex, url);
  if (ec) {
    ++failures;
    co_return;
  }
  auto [sec, snd] = co_await blobpipe::sender::start(std::move(t));
  if (sec) {
    ++failures;
    co_return;
  }
  for (std::size_t k = 0; k < count; ++k) {
    const std::string n = std::to_string(first + k);
    auto b = snd.open_blob();
    std::error_code e;
    if (!e) e = co_await b.emit(n + "@input_ids", blobpipe::value::tensor(s.ids));
    if (!e) e = co_await b.emit(n + "@generation_logprobs", blobpipe::value::tensor(s.logprobs));
    if (!e) e = co_await b.emit(n + "@token_mask", blobpipe::value::tensor(s.mask));
    if (!e) e = co_await b.emit(n + "@reward", blobpipe::value::scalar(s.reward));
    if (!e) e = co_await b.emit(n + "@meta", blobpipe::value::pickle(s.meta));
    if (!e) e = co_await b.finish();
    if (e) {
      ++failures;
      co_return;
    }
  }
  if (co_await snd.shutdown()) ++failures;
}

asio::awaitable<std::error_code> write_out(blobpipe::transport& t, const blobpipe::outbox& out) {
  std::vector<asio::const_buffer> bufs;
  for (const auto& p : out.pieces()) {
    const auto b = p.bytes(out);
    bufs.emplace_back(b.data(), b.size());
  }
  co_return co_await t.write(std::span(bufs.data(), bufs.size()));
}

/// Reads the next frame's header and skips its payload.
asio::awaitable<std::error_code> next_frame(blobpipe::transport& t, blobpipe::frame_header& h,
                                            std::vector<std::byte>& payload) {
  std::array<std::byte, blobpipe::frame_header_size> head;
  if (auto ec = co_await t.read_exact(head)) co_return ec;
  auto d = blobpipe::decode_frame_header(head, ~std::uint32_t{0});
  if (!d) co_return d.code();
  h = *d;
  payload.resize(h.length);
  if (h.length != 0) co_return co_await t.read_exact(payload);
  co_return std::error_code{};
}

/// A hand-framed sender's start (the bad and the flood senders below):
/// connects to `url`, says hello with credit grants (and asks for
/// `credit_request` bytes when not 0) and reads the server's hello. No
/// transport when any of it failed.
struct raw_sender {
  std::unique_ptr<blobpipe::transport> t;
  blobpipe::hello theirs;
};
asio::awaitable<raw_sender> raw_sender_start(std::string url, std::uint64_t credit_request) {
  using namespace blobpipe;
  auto ex = co_await asio::this_coro::executor;
  auto [ec, t] = co_await connect(ex, url);
  if (ec) co_return raw_sender{};
  outbox out;
  frame_hello(out, hello{.role = wire_role::sender, .features = feature_credit_grants});
  if (credit_request != 0) frame_credit_request(out, credit_request);
  if (co_await write_out(*t, out)) co_return raw_sender{};
  frame_header h;
  std::vector<std::byte> payload;
  if (co_await next_frame(*t, h, payload)) co_return raw_sender{};
  auto theirs = decode_hello(payload);
  if (!theirs) co_return raw_sender{};
  co_return raw_sender{std::move(t), *theirs};
}

/// The bad sender: asks for 2^64 - 1 bytes of credit, announces one entry
/// of 64 MiB (or less, what it was granted) and sends its bytes one at a
/// time every 10 ms until the server ends it or `stop` is set.
asio::awaitable<void> bad_sender(std::string url, const bool& stop) {
  using namespace blobpipe;
  auto ex = co_await asio::this_coro::executor;
  auto [t, theirs] = co_await raw_sender_start(std::move(url), ~std::uint64_t{0});
  if (!t) co_return;
  outbox out;
  frame_header h;
  std::vector<std::byte> payload;
  std::uint64_t granted = theirs.window_bytes;
  std::vector<std::uint8_t> bytes(64u << 20, 1);
  while (granted < (64u << 20) + 4096) {
    if (co_await next_frame(*t, h, payload)) co_return;
    if (h.type == frame_type::ack) granted += h.arg;
  }
  layout_builder lb;
  const planned_entry* pe = *lb.add("x", value::tensor(bytes));
  const auto meta = pe->entry.meta();
  out.clear();
  frame_blob_begin(out, 1, tag_t{});
  frame_entry_begin(out, 1, 0, pe->entry, meta);
  if (co_await write_out(*t, out)) co_return;
  asio::steady_timer pause(ex);
  const auto data = std::as_bytes(std::span(bytes));
  for (std::size_t off = 0; off < data.size() && !stop; ++off) {
    pause.expires_after(std::chrono::milliseconds(10));
    co_await pause.async_wait(asio::use_awaitable);
    out.clear();
    frame_data(out, 1, pe->entry.off + off, data.subspan(off, 1), theirs.max_chunk_bytes, true);
    if (co_await write_out(*t, out)) co_return;  // the server ended it
  }
}

/// The begin+abort flood (without fair turns, docs/cluster.md, it cuts an
/// honest run from 165 to 48 MB/s): on its own thread and io_context, as
/// another process would be, a hello, then begin+abort pairs of empty
/// blobs, 4,096 to a write (256 KiB), until the server ends the connection.
/// Counts the pairs.
asio::awaitable<void> flood_sender(std::string url, std::uint64_t& pairs) {
  using namespace blobpipe;
  auto [t, theirs] = co_await raw_sender_start(std::move(url), 0);
  if (!t) co_return;
  outbox out;
  for (;;) {
    out.clear();
    for (int i = 0; i < 4096; ++i) {
      ++pairs;
      frame_blob_begin(out, pairs, tag_t{});
      frame_blob_abort(out, pairs, "");
    }
    if (co_await write_out(*t, out)) co_return;  // the server closed it
  }
}

// CPU seconds (user + system) and minor page faults of this process so
// far (getrusage).
struct usage {
  double cpu = 0;
  long faults = 0;
};
usage usage_now() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return {sec(u.ru_utime) + sec(u.ru_stime), u.ru_minflt};
}

struct phase_result {
  double seconds = 0;
  double cpu = 0;  // CPU seconds over the whole phase (all on this thread)
  long faults = 0;  // minor page faults over the whole phase
  double wall = 0;  // wall seconds over the whole phase, connects included
  std::uint64_t bytes = 0;
  blobpipe::server_stats stats;
  int failures = 0;
  std::uint64_t bad_timed_out = 0;  // connections without entries ended by a timeout
  std::uint64_t bad_aborts = 0;     // blobs aborted on connections without entries (the flood's)
  std::uint64_t flood_pairs = 0;    // begin+abort pairs the flood wrote
};

/// The one bad sender beside the honest ones: none, the stalling one
/// (bad_sender) or the begin+abort flood (flood_sender).
enum class bad_kind { none, stall, flood };

// `senders` senders share cfg.samples; the consumer waits `slow_us` per entry.
// `bad_mode`: one bad sender beside them, closed when they are done.
phase_result run_phase(const config& cfg, std::size_t senders, std::uint64_t slow_us,
                       bad_kind bad_mode = bad_kind::none) {
  const bool bad = bad_mode != bad_kind::none;
  asio::io_context ctx;
  blobpipe::server_options opt;
  opt.budget_bytes = cfg.budget_mb << 20;
  opt.stream_bytes = cfg.stream_kb << 10;
  opt.threads = cfg.threads;
  auto srv = blobpipe::server::listen(ctx.get_executor(), "tcp://127.0.0.1:0", opt);
  if (!srv) {
    std::fprintf(stderr, "cluster_bench: listen: %s\n", srv.message().c_str());
    std::exit(1);
  }
  const sample_data s(cfg.seq_len);
  phase_result r;
  clock::time_point first{}, last{};
  bool any = false;
  bool stop = false;
  auto consume = [&]() -> asio::awaitable<void> {
    std::size_t closed = 0;
    std::vector<std::uint64_t> honest;  // connections that yielded entries
    asio::steady_timer pause(ctx);
    for (;;) {
      auto ev = co_await srv->next();
      if (ev.kind == blobpipe::server_event_kind::end_of_stream) break;
      if (ev.kind == blobpipe::server_event_kind::entry_ready) {
        if (std::find(honest.begin(), honest.end(), ev.connection->id) == honest.end())
          honest.push_back(ev.connection->id);
        if (!any) first = clock::now();
        any = true;
        r.bytes += ev.ev.entry->entry.len;
        if (slow_us) {
          pause.expires_after(std::chrono::microseconds(slow_us));
          co_await pause.async_wait(asio::use_awaitable);
        }
      }
      if (ev.kind == blobpipe::server_event_kind::blob_aborted &&
          std::find(honest.begin(), honest.end(), ev.connection->id) == honest.end())
        ++r.bad_aborts;
      if (ev.kind == blobpipe::server_event_kind::connection_closed && !stop &&
          std::find(honest.begin(), honest.end(), ev.connection->id) == honest.end() &&
          ev.ev.error == blobpipe::errc::timed_out)
        ++r.bad_timed_out;
      if (ev.kind == blobpipe::server_event_kind::connection_closed &&
          std::find(honest.begin(), honest.end(), ev.connection->id) != honest.end()) {
        last = clock::now();
        if (++closed == senders) {
          stop = true;
          if (bad) srv->close();  // the bad sender too
          else srv->stop_accepting();
        }
        continue;
      }
      if (ev.kind != blobpipe::server_event_kind::connection_closed) last = clock::now();
    }
  };
  asio::co_spawn(ctx, consume(), asio::detached);
  const std::string url = srv->url();
  if (bad_mode == bad_kind::stall) asio::co_spawn(ctx, bad_sender(url, stop), asio::detached);
  std::thread flood;
  if (bad_mode == bad_kind::flood)
    flood = std::thread([url, &r] {
      asio::io_context fctx;
      asio::co_spawn(fctx, flood_sender(url, r.flood_pairs), asio::detached);
      fctx.run();
    });
  for (std::size_t i = 0; i < senders; ++i) {
    const std::size_t lo = cfg.samples * i / senders, hi = cfg.samples * (i + 1) / senders;
    asio::co_spawn(ctx, send_share(url, s, lo, hi - lo, r.failures), asio::detached);
  }
  const usage u0 = usage_now();
  const auto wall0 = clock::now();
  ctx.run();
  if (flood.joinable()) flood.join();  // its connection was closed: its write failed
  const usage u1 = usage_now();
  r.cpu = u1.cpu - u0.cpu;
  r.faults = u1.faults - u0.faults;
  r.wall = std::chrono::duration<double>(clock::now() - wall0).count();
  r.seconds = std::chrono::duration<double>(last - first).count();
  r.stats = srv->stats();
  return r;
}

// ---- senders in other processes (--process-runs) -------------------------

/// The child: `--send URL FIRST COUNT SEQ_LEN` streams its share and exits 0.
int run_sender(const char* url, std::size_t first, std::size_t count, std::size_t seq_len) {
  asio::io_context ctx;
  const sample_data s(seq_len);
  int failures = 0;
  asio::co_spawn(ctx, send_share(url, s, first, count, failures), asio::detached);
  ctx.run();
  return failures ? 1 : 0;
}

/// Starts this binary as a sender of samples [first, first + count).
pid_t spawn_sender(const std::string& url, std::size_t first, std::size_t count,
                   std::size_t seq_len) {
  const std::string f = std::to_string(first), c = std::to_string(count),
                    t = std::to_string(seq_len);
  const char* argv[] = {"cluster_bench", "--send", url.c_str(), f.c_str(), c.c_str(), t.c_str(),
                        nullptr};
  pid_t pid = 0;
  if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, const_cast<char* const*>(argv),
                    environ) != 0) {
    std::fprintf(stderr, "cluster_bench: cannot start a sender process\n");
    std::exit(1);
  }
  return pid;
}

// ---- the raw-socket floor (--process-runs) ------------------------------
//
// The same bytes with no protocol: each sender process writes every
// sample's five entries with one send() each on a plain TCP socket, and the
// server reads each ready socket into a 256 KiB buffer (epoll, level
// triggered) and counts. No framing, no flow control: what the kernel and
// the reads cost per byte with one connection and with N, on this machine.

/// The child: `--send-raw PORT FIRST COUNT SEQ_LEN` writes its share and exits 0.
int run_raw_sender(std::uint16_t port, std::size_t count, std::size_t seq_len) {
  const sample_data s(seq_len);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) return 1;
  const auto put = [fd](const void* p, std::size_t n) {
    const auto* b = static_cast<const char*>(p);
    while (n != 0) {
      const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      b += k;
      n -= static_cast<std::size_t>(k);
    }
    return true;
  };
  for (std::size_t k = 0; k < count; ++k)
    if (!put(s.ids.data(), s.ids.size() * 8) || !put(s.logprobs.data(), s.logprobs.size() * 4) ||
        !put(s.mask.data(), s.mask.size()) || !put(&s.reward, 4) ||
        !put(s.meta.data(), s.meta.size()))
      return 1;
  ::close(fd);
  return 0;
}

/// CPU time each thread of this process has run, nanoseconds, by thread
/// id (/proc/self/task/TID/schedstat: the scheduler's own count).
std::map<long, std::uint64_t> thread_cpu_ns() {
  std::map<long, std::uint64_t> out;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream f(d.path() / "schedstat");
    std::uint64_t run_ns = 0;
    if (f >> run_ns) out[std::stol(d.path().filename().string())] = run_ns;
  }
  return out;
}

struct process_phase {
  double seconds = 0;  // first to last entry
  double cpu = 0;      // this process (the server), user + system, over the phase
  // Of it, by thread (schedstat): the application's (home) thread, and the
  // receive threads together (0 with one: connections run at home).
  double home_cpu = 0;
  double receive_cpu = 0;
  std::uint64_t bytes = 0;
  int failures = 0;    // sender processes that did not exit 0
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double cpu_ns_per_byte() const { return bytes ? cpu * 1e9 / bytes : 0; }
};

/// The server here on `threads` receive threads, `senders` sender processes.
process_phase run_process_phase(const config& cfg, std::size_t senders, std::size_t threads) {
  asio::io_context ctx;
  blobpipe::server_options opt;
  opt.budget_bytes = cfg.budget_mb << 20;
  opt.stream_bytes = cfg.stream_kb << 10;
  opt.threads = threads;
  auto srv = blobpipe::server::listen(ctx.get_executor(), "tcp://127.0.0.1:0", opt);
  if (!srv) {
    std::fprintf(stderr, "cluster_bench: listen: %s\n", srv.message().c_str());
    std::exit(1);
  }
  process_phase r;
  clock::time_point first{}, last{};
  bool any = false;
  auto consume = [&]() -> asio::awaitable<void> {
    std::size_t closed = 0;
    for (;;) {
      auto ev = co_await srv->next();
      if (ev.kind == blobpipe::server_event_kind::end_of_stream) break;
      if (ev.kind == blobpipe::server_event_kind::entry_ready) {
        if (!any) first = clock::now();
        any = true;
        last = clock::now();
        r.bytes += ev.ev.entry->entry.len;
      }
      if (ev.kind == blobpipe::server_event_kind::connection_closed && ++closed == senders)
        srv->stop_accepting();
    }
  };
  asio::co_spawn(ctx, consume(), asio::detached);
  const usage u0 = usage_now();
  const auto by_thread0 = thread_cpu_ns();
  std::vector<pid_t> pids;
  for (std::size_t i = 0; i < senders; ++i) {
    const std::size_t lo = cfg.samples * i / senders, hi = cfg.samples * (i + 1) / senders;
    pids.push_back(spawn_sender(srv->url(), lo, hi - lo, cfg.seq_len));
  }
  ctx.run();
  const auto by_thread1 = thread_cpu_ns();  // before the receive threads are joined
  for (const auto& [tid, ns] : by_thread1) {
    const auto was = by_thread0.find(tid);
    const double spent = (ns - (was == by_thread0.end() ? 0 : was->second)) / 1e9;
    (tid == ::getpid() ? r.home_cpu : r.receive_cpu) += spent;
  }
  *srv = blobpipe::server{};  // joins the receive threads: their CPU is in
  r.cpu = usage_now().cpu - u0.cpu;
  r.seconds = std::chrono::duration<double>(last - first).count();
  for (pid_t p : pids) {
    int status = 0;
    if (::waitpid(p, &status, 0) != p || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      ++r.failures;
  }
  return r;
}

/// A raw-socket server here, `senders` raw sender processes.
process_phase run_raw_phase(const config& cfg, std::size_t senders) {
  process_phase r;
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof a;
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(lfd, 128) != 0 || ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &alen) != 0) {
    std::fprintf(stderr, "cluster_bench: raw listen failed\n");
    std::exit(1);
  }
  const std::string port = std::to_string(ntohs(a.sin_port));
  const int ep = ::epoll_create1(0);
  epoll_event lev{};
  lev.events = EPOLLIN;
  lev.data.fd = lfd;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &lev);
  const usage u0 = usage_now();
  std::vector<pid_t> pids;
  const sample_data probe(cfg.seq_len);
  for (std::size_t i = 0; i < senders; ++i) {
    const std::size_t lo = cfg.samples * i / senders, hi = cfg.samples * (i + 1) / senders;
    const std::string c = std::to_string(hi - lo), t = std::to_string(cfg.seq_len);
    const char* argv[] = {"cluster_bench", "--send-raw", port.c_str(), c.c_str(), t.c_str(),
                          nullptr};
    pid_t pid = 0;
    if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, const_cast<char* const*>(argv),
                      environ) != 0)
      std::exit(1);
    pids.push_back(pid);
  }
  std::vector<std::byte> buf(256 << 10);
  std::size_t accepted = 0, closed = 0;
  clock::time_point first{}, last{};
  std::array<epoll_event, 64> evs{};
  while (closed < senders) {
    const int n = ::epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), 10000);
    if (n <= 0) break;  // a sender died: its failure is counted below
    for (int i = 0; i < n; ++i) {
      const int fd = evs[static_cast<std::size_t>(i)].data.fd;
      if (fd == lfd) {
        const int c = ::accept(lfd, nullptr, nullptr);
        if (c < 0) continue;
        ++accepted;
        epoll_event cev{};
        cev.events = EPOLLIN;
        cev.data.fd = c;
        ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        continue;
      }
      const ssize_t k = ::recv(fd, buf.data(), buf.size(), 0);
      if (k > 0) {
        if (r.bytes == 0) first = clock::now();
        last = clock::now();
        r.bytes += static_cast<std::uint64_t>(k);
      } else {
        ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        ::close(fd);
        ++closed;
      }
    }
  }
  r.cpu = usage_now().cpu - u0.cpu;
  r.seconds = std::chrono::duration<double>(last - first).count();
  ::close(ep);
  ::close(lfd);
  for (pid_t p : pids) {
    int status = 0;
    if (::waitpid(p, &status, 0) != p || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      ++r.failures;
  }
  if (r.bytes != cfg.samples * probe.bytes()) ++r.failures;
  return r;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/// --process-runs: interleaved rounds of the three phases, then medians.
int process_runs(const config& cfg) {
  const std::size_t many_threads = cfg.threads > 1 ? cfg.threads : 2;
  std::printf("senders in other processes; %zu interleaved rounds; server CPU from getrusage "
              "(this process only)\n", cfg.process_runs);
  std::vector<double> one_gbps, many_gbps, thr_gbps, one_cpu, many_cpu, thr_cpu;
  std::vector<double> raw_one_cpu, raw_many_cpu, raw_one_gbps, raw_many_gbps;
  std::vector<double> thr_home_cpu, thr_receive_cpu;  // ns per byte, by thread
  int failures = 0;
  const auto line = [](const char* name, std::size_t round, const process_phase& p) {
    std::printf("round %zu  %-34s %7.3f GB/s  server cpu %6.3f s  %7.3f ns/byte", round, name,
                p.gbps(), p.cpu, p.cpu_ns_per_byte());
    if (p.receive_cpu > 0)
      std::printf("  (home %.3f, receive threads %.3f ns/byte)", p.home_cpu * 1e9 / p.bytes,
                  p.receive_cpu * 1e9 / p.bytes);
    std::printf("%s\n", p.failures ? "  (FAILURES)" : "");
  };
  char many_name[64], thr_name[64];
  std::snprintf(many_name, sizeof many_name, "%zu senders, 1 receive thread", cfg.senders);
  std::snprintf(thr_name, sizeof thr_name, "%zu senders, %zu receive threads", cfg.senders,
                many_threads);
  char raw_many_name[64];
  std::snprintf(raw_many_name, sizeof raw_many_name, "raw socket, %zu connections", cfg.senders);
  for (std::size_t k = 1; k <= cfg.process_runs; ++k) {
    const auto one = run_process_phase(cfg, 1, 1);
    line("1 sender, 1 connection", k, one);
    const auto many = run_process_phase(cfg, cfg.senders, 1);
    line(many_name, k, many);
    const auto thr = run_process_phase(cfg, cfg.senders, many_threads);
    line(thr_name, k, thr);
    const auto raw_one = run_raw_phase(cfg, 1);
    line("raw socket, 1 connection", k, raw_one);
    const auto raw_many = run_raw_phase(cfg, cfg.senders);
    line(raw_many_name, k, raw_many);
    std::fflush(stdout);
    failures += one.failures + many.failures + thr.failures + raw_one.failures + raw_many.failures;
    thr_home_cpu.push_back(thr.bytes ? thr.home_cpu * 1e9 / thr.bytes : 0);
    thr_receive_cpu.push_back(thr.bytes ? thr.receive_cpu * 1e9 / thr.bytes : 0);
    raw_one_gbps.push_back(raw_one.gbps());
    raw_many_gbps.push_back(raw_many.gbps());
    raw_one_cpu.push_back(raw_one.cpu_ns_per_byte());
    raw_many_cpu.push_back(raw_many.cpu_ns_per_byte());
    one_gbps.push_back(one.gbps());
    many_gbps.push_back(many.gbps());
    thr_gbps.push_back(thr.gbps());
    one_cpu.push_back(one.cpu_ns_per_byte());
    many_cpu.push_back(many.cpu_ns_per_byte());
    thr_cpu.push_back(thr.cpu_ns_per_byte());
  }
  const auto ratios = [](const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> r;  // per round: a / b (same round, so the same machine state)
    for (std::size_t i = 0; i < a.size(); ++i) r.push_back(b[i] > 0 ? a[i] / b[i] : 0);
    return r;
  };
  std::printf("medians over %zu rounds:\n", cfg.process_runs);
  std::printf("  1 sender, 1 connection              %7.3f GB/s  %7.3f ns/byte\n",
              median(one_gbps), median(one_cpu));
  std::printf("  %-35s %7.3f GB/s  %7.3f ns/byte\n", many_name, median(many_gbps),
              median(many_cpu));
  std::printf("  %-35s %7.3f GB/s  %7.3f ns/byte\n", thr_name, median(thr_gbps),
              median(thr_cpu));
  std::printf("  raw socket, 1 connection             %7.3f GB/s  %7.3f ns/byte\n",
              median(raw_one_gbps), median(raw_one_cpu));
  std::printf("  %-35s %7.3f GB/s  %7.3f ns/byte\n", raw_many_name, median(raw_many_gbps),
              median(raw_many_cpu));
  std::printf("  fan-in bytes/s over one connection's: %.2fx (1 thread), %.2fx (%zu threads)\n",
              median(ratios(many_gbps, one_gbps)), median(ratios(thr_gbps, one_gbps)),
              many_threads);
  std::printf("  server CPU per byte over one connection's: %.2fx (1 thread; target <= 1.1), "
              "%.2fx (%zu threads)\n",
              median(ratios(many_cpu, one_cpu)), median(ratios(thr_cpu, one_cpu)), many_threads);
  std::printf("  raw socket CPU per byte, %zu connections over 1: %.2fx (the machine's own "
              "fan-in cost, no protocol)\n",
              cfg.senders, median(ratios(raw_many_cpu, raw_one_cpu)));
  std::printf("  server CPU per byte over the raw socket's: %.2fx (1 connection), %.2fx (%zu "
              "senders, 1 thread)\n",
              median(ratios(one_cpu, raw_one_cpu)), median(ratios(many_cpu, raw_many_cpu)),
              cfg.senders);
  {
    // A server machine of 16 cores, its senders elsewhere (RL's workers
    // run on other nodes): the home thread on one core, 15 receive
    // threads on the others, each byte costing what it cost each side
    // here. An estimate: it assumes a receive thread's CPU per byte does
    // not grow with their number.
    const double home = median(thr_home_cpu), receive = median(thr_receive_cpu);
    if (home > 0 && receive > 0)
      std::printf("  16 cores, from the %zu-thread phase's CPU per byte (home %.3f ns, receive "
                  "threads %.3f ns): the home thread alone allows %.2f GB/s, 15 receive threads "
                  "%.2f GB/s: about %.2f GB/s\n",
                  many_threads, home, receive, 1 / home, 15 / receive,
                  std::min(1 / home, 15 / receive));
  }
  std::printf("  %zu receive threads over 1: %.2fx bytes/s, %.2fx CPU per byte\n", many_threads,
              median(ratios(thr_gbps, many_gbps)), median(ratios(thr_cpu, many_cpu)));
  return failures ? 1 : 0;
}

double gbps(const phase_result& r) { return r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0; }
double ms(std::uint64_t ns) { return static_cast<double>(ns) / 1e6; }

bool number(std::string_view v, std::uint64_t& out) {
  char* end = nullptr;
  const std::string s(v);
  out = std::strtoull(s.c_str(), &end, 10);
  return !s.empty() && end && *end == '\0';
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  if (argc == 5 && std::string_view(argv[1]) == "--send-raw") {
    std::uint64_t port = 0, count = 0, seq_len = 0;
    if (!number(argv[2], port) || !number(argv[3], count) || !number(argv[4], seq_len)) return 2;
    return run_raw_sender(static_cast<std::uint16_t>(port), count, seq_len);
  }
  if (argc == 6 && std::string_view(argv[1]) == "--send") {
    std::uint64_t first = 0, count = 0, seq_len = 0;
    if (!number(argv[3], first) || !number(argv[4], count) || !number(argv[5], seq_len)) return 2;
    return run_sender(argv[2], first, count, seq_len);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--one-phase") {
      cfg.one_phase = true;
      continue;
    }
    std::uint64_t v = 0;
    if (i + 1 >= argc || !number(argv[i + 1], v) || v == 0) {
      std::fprintf(stderr,
                   "usage: cluster_bench [--senders N] [--samples N] [--seq-len T] [--slow-us U] "
                   "[--budget-mb M] [--stream-kb K] [--threads N] [--process-runs R] [--one-phase] "
                   "(positive numbers)\n");
      return 2;
    }
    ++i;
    if (a == "--senders") cfg.senders = v;
    else if (a == "--samples") cfg.samples = v;
    else if (a == "--seq-len") cfg.seq_len = v;
    else if (a == "--slow-us") cfg.slow_us = v;
    else if (a == "--budget-mb") cfg.budget_mb = v;
    else if (a == "--stream-kb") cfg.stream_kb = v;
    else if (a == "--threads") cfg.threads = v;
    else if (a == "--process-runs") cfg.process_runs = v;
    else {
      std::fprintf(stderr, "cluster_bench: unknown option %s\n", argv[i - 1]);
      return 2;
    }
  }
  const sample_data probe(cfg.seq_len);
  std::printf("cluster_bench: %zu samples of %llu bytes (seq-len %zu), budget %llu MiB, "
              "stream %llu KiB, TCP loopback\n",
              cfg.samples, static_cast<unsigned long long>(probe.bytes()), cfg.seq_len,
              static_cast<unsigned long long>(cfg.budget_mb),
              static_cast<unsigned long long>(cfg.stream_kb));
  if (cfg.one_phase) {
    // One phase, senders in processes: what a profiler attached to this
    // process sees is the server alone with cfg.senders connections.
    const auto p = run_process_phase(cfg, cfg.senders, cfg.threads);
    std::printf("%zu senders, %zu receive threads: %.3f GB/s  server cpu %.3f s  %.3f ns/byte%s\n",
                cfg.senders, cfg.threads, p.gbps(), p.cpu, p.cpu_ns_per_byte(),
                p.failures ? "  (FAILURES)" : "");
    return p.failures ? 1 : 0;
  }
  if (cfg.process_runs > 0) return process_runs(cfg);
  std::printf("server receive threads: %zu\n", cfg.threads);
  const auto one = run_phase(cfg, 1, 0);
  const auto many = run_phase(cfg, cfg.senders, 0);
  const auto slow = run_phase(cfg, cfg.senders, cfg.slow_us);
  const auto without_bad = run_phase(cfg, cfg.senders, 0);
  const auto with_bad = run_phase(cfg, cfg.senders, 0, bad_kind::stall);
  const auto with_flood = run_phase(cfg, cfg.senders, 0, bad_kind::flood);
  const auto line = [](const char* name, const phase_result& r) {
    const auto& l = r.stats.total.latency;
    std::printf("%-28s %8.3f GB/s  %7.3f s  cpu/wall %4.2f  p50 %8.3f ms  p99 %8.3f ms  "
                "credit waits %llu  high water %.1f MiB  page faults %ld%s\n",
                name, gbps(r), r.seconds, r.wall > 0 ? r.cpu / r.wall : 0.0,
                ms(l.percentile(0.5)), ms(l.percentile(0.99)),
                static_cast<unsigned long long>(r.stats.total.credit_waits),
                static_cast<double>(r.stats.pool.committed_high_water) / (1 << 20), r.faults,
                r.failures ? "  (FAILURES)" : "");
  };
  line("1 sender, 1 connection", one);
  char name[64];
  std::snprintf(name, sizeof name, "%zu senders, fan-in", cfg.senders);
  line(name, many);
  std::snprintf(name, sizeof name, "%zu senders, slow (%llu us)", cfg.senders,
                static_cast<unsigned long long>(cfg.slow_us));
  line(name, slow);
  std::printf("fan-in / single connection: %.2fx (target >= 0.9)\n",
              gbps(one) > 0 ? gbps(many) / gbps(one) : 0.0);
  std::snprintf(name, sizeof name, "%zu senders, no bad sender", cfg.senders);
  line(name, without_bad);
  std::snprintf(name, sizeof name, "%zu senders + 1 bad sender", cfg.senders);
  line(name, with_bad);
  std::printf("one bad sender: honest throughput %.2fx of without it; %llu bad connection(s) "
              "timed out, committed high water %.1f MiB\n",
              gbps(without_bad) > 0 ? gbps(with_bad) / gbps(without_bad) : 0.0,
              static_cast<unsigned long long>(with_bad.bad_timed_out),
              static_cast<double>(with_bad.stats.pool.committed_high_water) / (1 << 20));
  std::snprintf(name, sizeof name, "%zu senders + 1 flood", cfg.senders);
  line(name, with_flood);
  std::printf("begin+abort flood: honest throughput %.2fx of without it; the flood wrote %llu "
              "pairs, %llu of its aborts yielded\n",
              gbps(without_bad) > 0 ? gbps(with_flood) / gbps(without_bad) : 0.0,
              static_cast<unsigned long long>(with_flood.flood_pairs),
              static_cast<unsigned long long>(with_flood.bad_aborts));
  return one.failures || many.failures || slow.failures || without_bad.failures ||
                 with_bad.failures || with_flood.failures
             ? 1
             : 0;
}
