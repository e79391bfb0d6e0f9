// bench/entry_sizes.cpp — the streaming pipeline by entry size, against
// ZeroMQ and a raw socket, in one run (docs/performance.md).
//
//   bazel/bazelw run -c opt --symlink_prefix=/ //bench:entry_sizes -- --csv entry_sizes.csv
//   ... -- --quick       (small counts: checks that it runs)
//   ... -- --only "16 KiB" --column "blobpipe in" --samples 10000   (a part)
//   ... -- --cpu         (also each side's CPU seconds, user and system, per run)
//   ... -- --blob 5      (blobpipe in blobs of 5 only; or 1000)
//
// Workloads: entries of 64 B, 1 KiB, 16 KiB, 256 KiB, 1 MiB and 16 MiB,
// and an RL sample (int64[2048], float32[2048], bool[2048], a float32
// scalar, a 200-byte pickle: 26,828 bytes in 5 entries). Columns, each
// with its sender and its receiver on two threads:
//
// - blobpipe tcp: sender -> TCP loopback -> consumer, public API, default
//   options, in blobs of 5 and of 1,000 entries (fewer when the workload
//   has fewer); the consumer drops each entry as it arrives.
// - blobpipe in-process: the same over loopback::make_pair, its ends on
//   the two threads (no socket, no system call).
// - ZeroMQ PUSH/PULL over TCP loopback, one message per entry: at its
//   defaults (high-water mark 1000), and tuned (high-water marks 0 =
//   unbounded, 4 MiB socket buffers, zero-copy sends of the source buffer).
// - raw socket: the workload's bytes, concatenated, with blocking send()
//   of up to 1 MiB and recv() into a 1 MiB buffer (no framing at all): the
//   wire's ceiling in bytes/s.
// - raw socket landing (entries above 1 MiB): the same, the receiver
//   landing the bytes in a buffer of the entry's size, as a consumer must;
//   that buffer is not in the CPU's cache, and the kernel's copy into it
//   costs more than into the reused 1 MiB.
// - raw socket copying (workloads whose entries are all up to 64 KiB,
//   blobpipe's default inline_bytes: 64 B, 1 KiB, 16 KiB, the RL sample):
//   the copies blobpipe makes for such entries and nothing else. The
//   sender copies each entry into its staging buffer (blobpipe's copy at
//   `emit`), the receiver reads
//   into its 1 MiB buffer and copies each entry out into memory of its
//   own, allocated per entry and freed once whole (blobpipe's copy out of
//   the receive buffer into the entry's block, which the application
//   drops). The RL-sample target (docs/performance.md "Targets")
//   is against it.
//
// Each cell is the best of 3 runs (interleaved by column), with the
// spread (worst/best) in the CSV. Entries/s count entries delivered to the
// receiver; GB/s count entry bytes (10^9). A benchmark reports; it never
// gates: the exit status is 0 unless something failed to run.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/pipeline.hpp"

namespace {

namespace bp = blobpipe;
using clock_type = std::chrono::steady_clock;

struct workload {
  std::string name;
  std::vector<std::size_t> sizes;  // entry sizes of one sample, bytes
  std::size_t samples = 0;         // how many samples one run sends
  std::uint64_t sample_bytes() const {
    std::uint64_t n = 0;
    for (auto s : sizes) n += s;
    return n;
  }
  std::uint64_t entries() const { return samples * sizes.size(); }
  std::uint64_t bytes() const { return samples * sample_bytes(); }
};

struct cell {
  double best = 0, worst = 0;  // seconds
  bool ok = true;
  std::string note;
};

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

/// --cpu: each side's CPU seconds (this thread's, user and system) beside
/// the run's wall time, printed after every run. CPU time does not depend
/// on what else runs on the machine, so it shows which side is busy and
/// which waits even on a loaded one (docs/performance.md "Where the time goes").
bool print_cpu = false;

struct thread_cpu {
  double user = 0, sys = 0;
  long faults = 0;  // minor page faults
  long switches = 0;  // voluntary context switches: how often the thread slept
  static thread_cpu now() {
    rusage u{};
    ::getrusage(RUSAGE_THREAD, &u);
    return {u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6,
            u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6, u.ru_minflt, u.ru_nvcsw};
  }
  thread_cpu since(const thread_cpu& start) const {
    return {user - start.user, sys - start.sys, faults - start.faults, switches - start.switches};
  }
};

void report_cpu(const char* column, double wall, const thread_cpu& sender, const thread_cpu& receiver) {
  if (!print_cpu) return;
  std::printf("    cpu %s: wall %.3f s; sender user %.3f sys %.3f s (%.0f%% of wall), %ld faults, "
              "%ld sleeps; receiver user %.3f sys %.3f s (%.0f%%), %ld faults, %ld sleeps\n",
              column, wall, sender.user, sender.sys, 100 * (sender.user + sender.sys) / wall,
              sender.faults, sender.switches, receiver.user, receiver.sys,
              100 * (receiver.user + receiver.sys) / wall, receiver.faults, receiver.switches);
}

/// One reused source buffer per entry size: every entry is a view of it.
struct sources {
  std::vector<std::vector<std::byte>> bufs;
  explicit sources(const workload& w) {
    for (auto s : w.sizes) {
      std::vector<std::byte> b(s);
      for (std::size_t i = 0; i < s; ++i) b[i] = std::byte(i * 131 + s);
      bufs.push_back(std::move(b));
    }
  }
};

bp::value value_of(const std::vector<std::byte>& b, std::size_t k, std::size_t n_kinds) {
  // The RL sample's entries as typed values; sizes from the workload.
  if (n_kinds == 5) {
    switch (k) {
      case 0: return bp::value::tensor_bytes(b, "int64", {std::int64_t(b.size() / 8)});
      case 1: return bp::value::tensor_bytes(b, "float32", {std::int64_t(b.size() / 4)});
      case 2: return bp::value::tensor_bytes(b, "bool", {std::int64_t(b.size())});
      case 3: return bp::value::tensor_bytes(b, "float32", {});
      default: return bp::value::pickle(b);
    }
  }
  return bp::value::tensor_bytes(b, "uint8", {std::int64_t(b.size())});
}

// ---- blobpipe ----------------------------------------------------------------

enum class link { tcp, inproc };

/// Sends the workload in blobs of `per_blob` entries from one thread to a
/// consumer on another; seconds from the first emit to the consumer's end
/// of stream.
double run_blobpipe(link l, const workload& w, std::size_t per_blob, std::string& error) {
  sources src(w);
  asio::io_context ctx_s, ctx_c;
  std::unique_ptr<bp::transport> ts, tc;
  std::optional<bp::tcp::listener> lis;
  std::uint64_t received = 0;
  std::atomic<bool> started{false};
  clock_type::time_point t0;
  double elapsed = 0;
  std::uint64_t credit_waits = 0;  // times a producer waited for window credit
  if (l == link::inproc) {
    auto [a, b] = bp::loopback::make_pair(ctx_s.get_executor(), ctx_c.get_executor());
    ts = std::move(a);
    tc = std::move(b);
  } else {
    lis.emplace(bp::tcp::listen(ctx_c.get_executor(), 0).value());
  }
  const std::uint16_t port = lis ? lis->port() : 0;
  asio::co_spawn(ctx_c, [&]() -> asio::awaitable<void> {
    if (!tc) {
      auto [ec, t] = co_await lis->accept();
      if (ec) {
        error = "accept: " + ec.message();
        co_return;
      }
      tc = std::move(t);
    }
    auto [ec, c] = co_await bp::consumer::start(std::move(tc));
    if (ec) {
      error = "consumer: " + ec.message();
      co_return;
    }
    // A read's events at once (next_batch), each dropped as it is counted.
    std::vector<bp::event> batch;
    for (bool end = false; !end;) {
      batch.clear();
      co_await c.next_batch(batch);
      for (auto& ev : batch) {
        if (ev.kind == bp::event_kind::entry_ready) ++received;
        if (ev.kind == bp::event_kind::end_of_stream) {
          if (ev.error) error = "stream: " + bp::escape(ev.reason);
          end = true;
        }
        ev = bp::event{};
      }
    }
    elapsed = seconds_since(t0);
  }, asio::detached);
  asio::co_spawn(ctx_s, [&]() -> asio::awaitable<void> {
    if (!ts) {
      auto [ec, t] = co_await bp::tcp::connect(ctx_s.get_executor(), "127.0.0.1", port);
      if (ec) {
        error = "connect: " + ec.message();
        co_return;
      }
      ts = std::move(t);
    }
    auto [ec, s] = co_await bp::sender::start(std::move(ts));
    if (ec) {
      error = "sender: " + ec.message();
      co_return;
    }
    t0 = clock_type::now();
    started = true;
    std::uint64_t sent = 0;
    const std::uint64_t total = w.entries();
    while (sent < total) {
      auto blob = s.open_blob();
      for (std::size_t i = 0; i < per_blob && sent < total; ++i, ++sent) {
        const std::size_t k = sent % w.sizes.size();
        if (auto e = co_await blob.emit("e", value_of(src.bufs[k], k, w.sizes.size()))) {
          error = "emit: " + e.message();
          co_return;
        }
      }
      if (auto e = co_await blob.finish()) {
        error = "finish: " + e.message();
        co_return;
      }
    }
    credit_waits = s.stats().credit_waits;
    if (auto e = co_await s.shutdown()) error = "shutdown: " + e.message();
  }, asio::detached);
  thread_cpu consumer_cpu;
  std::thread consumer_thread([&] {
    const auto start = thread_cpu::now();
    ctx_c.run();
    consumer_cpu = thread_cpu::now().since(start);
  });
  const auto sender_start = thread_cpu::now();
  ctx_s.run();
  const auto sender_cpu = thread_cpu::now().since(sender_start);
  consumer_thread.join();
  report_cpu(l == link::tcp ? "blobpipe tcp" : "blobpipe in-process", elapsed, sender_cpu,
             consumer_cpu);
  if (print_cpu) std::printf("    sender waited for credit %llu times\n", (unsigned long long)credit_waits);
  if (error.empty() && received != w.entries())
    error = "received " + std::to_string(received) + " of " + std::to_string(w.entries());
  return elapsed;
}

// ---- ZeroMQ ------------------------------------------------------------------

double run_zmq(const workload& w, bool tuned, std::string& error) {
  sources src(w);
  void* ctx = zmq_ctx_new();
  void* pull = zmq_socket(ctx, ZMQ_PULL);
  void* push = zmq_socket(ctx, ZMQ_PUSH);
  if (tuned) {
    const int zero = 0, buf = 4 << 20;
    for (void* s : {pull, push}) {
      zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
      zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
      zmq_setsockopt(s, ZMQ_SNDBUF, &buf, sizeof buf);
      zmq_setsockopt(s, ZMQ_RCVBUF, &buf, sizeof buf);
    }
  }
  if (zmq_bind(pull, "tcp://127.0.0.1:*") != 0) {
    error = std::string("zmq_bind: ") + zmq_strerror(zmq_errno());
    return 0;
  }
  char endpoint[256];
  std::size_t len = sizeof endpoint;
  zmq_getsockopt(pull, ZMQ_LAST_ENDPOINT, endpoint, &len);
  zmq_connect(push, endpoint);
  std::size_t biggest = 0;
  for (auto s : w.sizes) biggest = std::max(biggest, s);
  const std::uint64_t total = w.entries();
  double elapsed = 0;
  std::atomic<bool> go{false};
  clock_type::time_point t0;
  std::thread receiver([&] {
    std::vector<std::byte> buf(std::max<std::size_t>(biggest, 1));
    std::uint64_t got = 0;
    while (got < total) {
      const int n = zmq_recv(pull, buf.data(), buf.size(), 0);
      if (n < 0) {
        error = std::string("zmq_recv: ") + zmq_strerror(zmq_errno());
        break;
      }
      ++got;
    }
    elapsed = seconds_since(t0);
  });
  t0 = clock_type::now();
  for (std::uint64_t i = 0; i < total; ++i) {
    const auto& b = src.bufs[i % w.sizes.size()];
    int rc;
    if (tuned && b.size() >= 4096) {
      // Zero copy: the message points at the source, which outlives it.
      zmq_msg_t m;
      zmq_msg_init_data(&m, const_cast<std::byte*>(b.data()), b.size(), nullptr, nullptr);
      rc = zmq_msg_send(&m, push, 0);
    } else {
      rc = zmq_send(push, b.data(), b.size(), 0);
    }
    if (rc < 0) {
      error = std::string("zmq_send: ") + zmq_strerror(zmq_errno());
      break;
    }
  }
  receiver.join();
  zmq_close(push);
  zmq_close(pull);
  zmq_ctx_term(ctx);
  return elapsed;
}

// ---- raw socket --------------------------------------------------------------

enum class raw_receiver {
  /// every piece into the same 1 MiB, which stays in the CPU's cache (the
  /// wire's ceiling)
  ceiling,
  /// the bytes landed in a buffer as large as the largest entry (at least
  /// 1 MiB), front to back, as a consumer lands an entry in its own buffer
  landing,
  /// read into the 1 MiB, then each entry copied out into memory of its
  /// own (allocated per entry, freed once the entry is whole)
  copying,
};

const char* raw_column(raw_receiver r) {
  switch (r) {
    case raw_receiver::ceiling: return "raw socket";
    case raw_receiver::landing: return "raw socket landing";
    case raw_receiver::copying: return "raw socket copying";
  }
  return "raw socket";
}

/// The workload's bytes over one TCP socket, no framing; up to 1 MiB a
/// send() and a recv(). The sender stages entries below 1 MiB back to back
/// in a 1 MiB buffer (one copy each) and sends larger ones from the source.
double run_raw(const workload& w, raw_receiver mode, std::string& error) {
  const bool landing = mode == raw_receiver::landing;
  sources src(w);
  std::size_t biggest = 0;
  for (auto s : w.sizes) biggest = std::max(biggest, s);
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof addr;
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 1) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) {
    error = "raw socket: bind/listen failed";
    ::close(lfd);
    return 0;
  }
  const std::uint64_t total = w.bytes();
  double elapsed = 0;
  clock_type::time_point t0;
  thread_cpu receiver_cpu;
  std::thread receiver([&] {
    const auto start = thread_cpu::now();
    const int fd = ::accept(lfd, nullptr, nullptr);
    std::vector<std::byte> buf(landing ? std::max(biggest, std::size_t{1} << 20) : 1 << 20);
    std::uint64_t got = 0;
    std::size_t at = 0;  // landing: where the next byte goes, as in an entry's buffer
    // copying: the entry being filled, its index in the sample, bytes in it
    std::unique_ptr<std::byte[]> entry;
    std::size_t entry_index = 0, entry_filled = 0;
    while (got < total) {
      const std::size_t room = std::min<std::size_t>(buf.size() - at, 1 << 20);
      const ssize_t n = ::recv(fd, buf.data() + at, room, 0);
      if (n <= 0) break;
      got += static_cast<std::uint64_t>(n);
      if (landing) at = (at + static_cast<std::size_t>(n)) % buf.size();
      if (mode != raw_receiver::copying) continue;
      for (std::size_t off = 0; off < static_cast<std::size_t>(n);) {
        const std::size_t size = w.sizes[entry_index];
        if (!entry) entry = std::make_unique_for_overwrite<std::byte[]>(size);
        const std::size_t take = std::min(size - entry_filled, static_cast<std::size_t>(n) - off);
        std::memcpy(entry.get() + entry_filled, buf.data() + off, take);
        off += take;
        entry_filled += take;
        if (entry_filled == size) {  // whole: the application drops it
          entry.reset();
          entry_filled = 0;
          entry_index = (entry_index + 1) % w.sizes.size();
        }
      }
    }
    elapsed = seconds_since(t0);
    receiver_cpu = thread_cpu::now().since(start);
    ::close(fd);
  });
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) error = "raw connect";
  // The sample's bytes back to back in a 1 MiB staging buffer, sent whole;
  // an entry of 1 MiB or more from its source, after what is staged (the
  // wire keeps the sample's order).
  std::vector<std::byte> stage;
  stage.reserve(1 << 20);
  auto send_all = [fd](std::span<const std::byte> bytes) {
    for (std::size_t at = 0; at < bytes.size();) {
      const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, 0);
      if (n <= 0) break;
      at += static_cast<std::size_t>(n);
    }
  };
  auto flush_stage = [&] {
    send_all(stage);
    stage.clear();
  };
  const auto sender_start = thread_cpu::now();
  t0 = clock_type::now();
  for (std::uint64_t s = 0; s < w.samples && error.empty(); ++s) {
    for (const auto& b : src.bufs) {
      if (b.size() >= (1 << 20)) {
        flush_stage();
        send_all(b);
        continue;
      }
      if (stage.size() + b.size() > (1 << 20)) flush_stage();
      stage.insert(stage.end(), b.begin(), b.end());
    }
  }
  flush_stage();
  const auto sender_cpu = thread_cpu::now().since(sender_start);
  receiver.join();
  report_cpu(raw_column(mode), elapsed, sender_cpu, receiver_cpu);
  ::close(fd);
  ::close(lfd);
  return elapsed;
}

// ---- the table ---------------------------------------------------------------

cell best_of(int reps, const std::function<double(std::string&)>& run) {
  cell c;
  for (int r = 0; r < reps; ++r) {
    std::string err;
    const double t = run(err);
    if (!err.empty() || t <= 0) {
      c.ok = false;
      c.note = err.empty() ? "no time" : err;
      return c;
    }
    c.best = r == 0 ? t : std::min(c.best, t);
    c.worst = std::max(c.worst, t);
  }
  return c;
}

std::string rate(const workload& w, const cell& c) {
  if (!c.ok) return "failed";
  char out[64];
  std::snprintf(out, sizeof out, "%10.0f /s %6.2f GB/s", w.entries() / c.best,
                w.bytes() / c.best / 1e9);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string csv_path, only, only_column;
  std::uint64_t count = 0;
  std::size_t only_blob = 0;  // --blob N: only blobs of N entries (5 or 1000)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--column" && i + 1 < argc) {
      only_column = argv[++i];
    } else if (a == "--samples" && i + 1 < argc) {
      count = std::stoull(argv[++i]);
    } else if (a == "--blob" && i + 1 < argc) {
      only_blob = std::stoull(argv[++i]);
    } else if (a == "--cpu") {
      print_cpu = true;
    } else if (a == "--csv" && i + 1 < argc) {
      csv_path = argv[++i];
      if (csv_path[0] != '/' && std::getenv("BUILD_WORKING_DIRECTORY"))
        csv_path = std::string(std::getenv("BUILD_WORKING_DIRECTORY")) + "/" + csv_path;
    } else {
      std::fprintf(stderr,
                   "usage: entry_sizes [--quick] [--only WORKLOAD] [--column PREFIX] "
                   "[--samples N] [--blob 5|1000] [--cpu] [--csv FILE]\n");
      return 1;
    }
  }
  const std::size_t k = 1024, m = k * k;
  // Counts sized for about a second per cell at the rates seen here.
  std::vector<workload> ws = {
      {"64 B", {64}, 2'000'000},
      {"1 KiB", {k}, 1'000'000},
      {"16 KiB", {16 * k}, 200'000},
      {"256 KiB", {256 * k}, 12'000},
      {"1 MiB", {m}, 3'000},
      {"16 MiB", {16 * m}, 192},
      {"RL sample", {16 * k, 8 * k, 2 * k, 4, 200}, 100'000},
  };
  const int reps = quick ? 1 : 3;
  if (quick)
    for (auto& w : ws) w.samples = std::max<std::size_t>(w.samples / 200, 2);
  if (count)
    for (auto& w : ws) w.samples = count;
  std::printf("entry_sizes: %u hardware threads; best of %d; sender and receiver on two threads\n",
              std::thread::hardware_concurrency(), reps);
  std::FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (csv)
    std::fprintf(csv, "workload,entry_bytes,entries,column,blob_entries,seconds_best,"
                      "seconds_worst,entries_per_s,gb_per_s\n");
  int failures = 0;
  auto wanted = [&](const char* column) {
    return only_column.empty() || std::string(column).rfind(only_column, 0) == 0;
  };
  auto report = [&](const workload& w, const char* column, std::size_t per_blob, const cell& c) {
    std::printf("  %-22s %-10s %s\n", column,
                per_blob ? ("blob " + std::to_string(per_blob)).c_str() : "", rate(w, c).c_str());
    if (!c.ok) {
      std::printf("    (%s)\n", c.note.c_str());
      ++failures;
      return;
    }
    if (csv)
      std::fprintf(csv, "%s,%llu,%llu,%s,%zu,%.6f,%.6f,%.0f,%.4f\n", w.name.c_str(),
                   (unsigned long long)(w.sample_bytes() / w.sizes.size()),
                   (unsigned long long)w.entries(), column, per_blob, c.best, c.worst,
                   w.entries() / c.best, w.bytes() / c.best / 1e9);
  };
  for (const auto& w : ws) {
    if (!only.empty() && w.name != only) continue;
    std::printf("[%s] %llu entries, %.2f GB\n", w.name.c_str(), (unsigned long long)w.entries(),
                w.bytes() / 1e9);
    for (std::size_t per_blob : {std::size_t{5}, std::size_t{1000}}) {
      const std::size_t n = std::min<std::size_t>(per_blob, w.entries());
      if (per_blob == 1000 && n <= 5) continue;
      if (only_blob != 0 && per_blob != only_blob) continue;
      if (wanted("blobpipe tcp"))
        report(w, "blobpipe tcp", n,
               best_of(reps, [&](std::string& e) { return run_blobpipe(link::tcp, w, n, e); }));
      if (wanted("blobpipe in-process"))
        report(w, "blobpipe in-process", n,
               best_of(reps, [&](std::string& e) { return run_blobpipe(link::inproc, w, n, e); }));
    }
    if (wanted("zeromq defaults"))
      report(w, "zeromq defaults", 0,
             best_of(reps, [&](std::string& e) { return run_zmq(w, false, e); }));
    if (wanted("zeromq tuned"))
      report(w, "zeromq tuned", 0,
             best_of(reps, [&](std::string& e) { return run_zmq(w, true, e); }));
    if (wanted("raw socket"))
      report(w, "raw socket", 0,
             best_of(reps, [&](std::string& e) { return run_raw(w, raw_receiver::ceiling, e); }));
    const bool large = w.sizes.size() == 1 && w.sizes[0] > (1 << 20);
    if (wanted("raw socket landing") && large)
      report(w, "raw socket landing", 0,
             best_of(reps, [&](std::string& e) { return run_raw(w, raw_receiver::landing, e); }));
    // Entries blobpipe copies (up to inline_bytes, 64 KiB by default) only:
    // larger ones it lands in place.
    const bool all_copied = std::all_of(w.sizes.begin(), w.sizes.end(),
                                        [](std::size_t n) { return n <= bp::default_inline_bytes; });
    if (wanted("raw socket copying") && all_copied)
      report(w, "raw socket copying", 0,
             best_of(reps, [&](std::string& e) { return run_raw(w, raw_receiver::copying, e); }));
  }
  if (csv) std::fclose(csv);
  return failures == 0 ? 0 : 1;
}
