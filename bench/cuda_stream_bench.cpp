// cuda_stream_bench — blobpipe streaming with device memory at either end,
// through an in-process loopback (or TCP on 127.0.0.1), next to plain
// cudaMemcpy of the same bytes. docs/cuda.md "Benchmark".
//
//   cuda_stream_bench [--mib-per-mode N] [--entry-mib N] [--frame-kib N]
//                     [--pinned-kib N] [--depth N] [--link loopback|tcp]
//                     [--emulated] [--require-device]
//
// Modes (each moves the same bytes, as entries of --entry-mib):
//   d2h  device values -> sender (staged through pinned) -> consumer (host)
//   h2d  host values   -> consumer landing in device memory
//   d2d  device values -> sender -> consumer landing in device memory
//   h2h  host values   -> consumer (host): the pipeline without CUDA
// Next to each: cudaMemcpy of one entry's bytes, repeated as often
// (D2H into pinned memory, H2D from pinned memory, D2D), and memcpy.
// Without a device it prints "SKIP: <reason>" and exits 0 (or 3 with
// --require-device). --emulated runs on the test-only CUDA emulator
// (lib/cuda/testing.hpp; meaningless numbers: a check that the benchmark
// itself works). Exit 1 when a mode or a reference copy failed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include "blobpipe/cuda.hpp"
#include "blobpipe/pipeline.hpp"
#include "lib/cuda/handles.hpp"
#include "lib/cuda/testing.hpp"

namespace {

using namespace blobpipe;
using clock_type = std::chrono::steady_clock;

struct options {
  std::uint64_t mib_per_mode = 1024;
  std::uint64_t entry_mib = 64;
  std::uint32_t frame_kib = 1024;
  std::uint32_t pinned_kib = 1024;
  std::uint32_t depth = 4;
  bool tcp = false;
  bool emulated = false;
  bool require_device = false;
};

enum class end { host, device };

struct mode {
  const char* name;
  const char* path;
  end from, to;
};

double gbps(std::uint64_t bytes, double seconds) { return double(bytes) / seconds / 1e9; }

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

asio::awaitable<std::pair<std::unique_ptr<transport>, std::unique_ptr<transport>>> make_link(
    bool tcp) {
  auto ex = co_await asio::this_coro::executor;
  if (!tcp) co_return loopback::make_pair(ex);
  auto lis = tcp::listen(ex, 0).value();
  std::unique_ptr<transport> accepted;
  asio::co_spawn(ex, lis.accept(), [&](std::exception_ptr, auto r) {
    accepted = std::move(std::get<1>(r));
  });
  auto [ec, connected] = co_await tcp::connect(ex, "127.0.0.1", lis.port());
  while (!accepted) co_await asio::post(ex, asio::use_awaitable);
  if (ec) throw std::runtime_error("tcp connect: " + ec.message());
  co_return std::pair{std::move(connected), std::move(accepted)};
}

/// Streams `count` entries of `src` (device or host memory) to a consumer
/// landing in `to`; returns seconds from the first emit to the last entry
/// in place. Entries are released as they arrive, so the window keeps
/// flowing. Checks the last entry's first and last bytes.
double stream(const options& o, const mode& m, const std::byte* src, std::uint64_t entry_bytes,
              std::uint64_t count, const std::vector<std::byte>& host_copy) {
  asio::io_context ctx;
  double secs = -1;
  std::string failure;
  auto run = [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto [a, b] = co_await make_link(o.tcp);
    consumer_options copt;
    copt.window_bytes = 4 * entry_bytes;
    copt.max_chunk_bytes = o.frame_kib * 1024;
    copt.max_entry_bytes = entry_bytes;
    copt.landing.enabled = m.to == end::device;
    copt.landing.pool_depth = o.depth;
    std::optional<consumer> c;
    asio::co_spawn(ex, consumer::start(std::move(b), copt), [&](std::exception_ptr, auto r) {
      if (std::get<0>(r)) failure = "consumer::start: " + std::get<0>(r).message();
      else c.emplace(std::move(std::get<1>(r)));
    });
    sender_options sopt;
    sopt.chunk_bytes = o.frame_kib * 1024;
    sopt.staging = {.pinned_chunk_bytes = o.pinned_kib * 1024, .pool_depth = o.depth};
    auto [sec, s] = co_await sender::start(std::move(a), sopt);
    if (sec) {
      failure = "sender::start: " + sec.message();
      co_return;
    }
    while (!c && failure.empty()) co_await asio::post(ex, asio::use_awaitable);
    if (!failure.empty()) co_return;
    value v = value::tensor_bytes(std::span(src, entry_bytes), "uint8",
                                  {static_cast<std::int64_t>(entry_bytes)});
    v.memory = m.from == end::device ? memory_kind::cuda_device : memory_kind::host;
    const auto t0 = clock_type::now();
    asio::co_spawn(ex, [&, v]() -> asio::awaitable<void> {
      auto blob = s.open_blob();
      for (std::uint64_t i = 0; i < count; ++i) {
        if (blob.entry_count() == 8) {  // 8 entries per blob
          (void)co_await blob.finish();
          blob = s.open_blob();
        }
        if (auto ec = co_await blob.emit("e" + std::to_string(i), v)) {
          failure = "emit: " + ec.message() + " " + blob.last_error();
          co_return;
        }
      }
      (void)co_await blob.finish();
      (void)co_await s.shutdown();
    }, asio::detached);
    std::uint64_t got = 0;
    for (;;) {
      auto ev = co_await c->next();
      if (ev.kind == event_kind::end_of_stream) {
        if (ev.error) failure = "stream: " + escape(ev.reason);
        break;
      }
      if (ev.kind == event_kind::blob_aborted) failure = "blob aborted: " + escape(ev.reason);
      if (ev.kind != event_kind::entry_ready) continue;
      if (++got == count) {
        secs = seconds_since(t0);
        // Spot check: the last entry's first and last 4 KiB.
        const std::size_t n = std::min<std::uint64_t>(4096, entry_bytes);
        std::vector<std::byte> head(n), tail(n);
        if (ev.entry->memory == memory_kind::cuda_device) {
          auto h = cuda::copy_sync(head.data(), ev.entry->device.data, n);
          auto t = h ? cuda::copy_sync(tail.data(), ev.entry->device.data + entry_bytes - n, n) : h;
          if (!t) failure = "spot check: " + t.message();
        } else {
          std::memcpy(head.data(), ev.entry->view.bytes.data(), n);
          std::memcpy(tail.data(), ev.entry->view.bytes.data() + entry_bytes - n, n);
        }
        if (failure.empty() && (std::memcmp(head.data(), host_copy.data(), n) != 0 ||
                                std::memcmp(tail.data(), host_copy.data() + entry_bytes - n, n) != 0))
          failure = "bytes differ";
      }
    }
  };
  asio::co_spawn(ctx, run(), [&](std::exception_ptr e) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        failure = x.what();
      }
    }
  });
  ctx.run();
  if (!failure.empty()) {
    std::printf("  %s: FAILED: %s\n", m.name, failure.c_str());
    return -1;
  }
  return secs;
}

/// cudaMemcpy (then cudaDeviceSynchronize) of `bytes`, `count` times:
/// seconds, or -1 (having said why) when a copy failed.
double copy_seconds(const char* what, void* dst, const void* src, std::uint64_t bytes,
                    std::uint64_t count) {
  auto r = cuda::copy_sync(dst, src, bytes);  // warm up
  const auto t0 = clock_type::now();
  for (std::uint64_t i = 0; r && i < count; ++i) r = cuda::copy_sync(dst, src, bytes);
  if (!r) {
    std::printf("  %s: FAILED: %s\n", what, r.message().c_str());
    return -1;
  }
  return seconds_since(t0);
}

int usage() {
  std::fprintf(stderr,
               "usage: cuda_stream_bench [--mib-per-mode N] [--entry-mib N] [--frame-kib N]\n"
               "       [--pinned-kib N] [--depth N] [--link loopback|tcp] [--emulated]\n"
               "       [--require-device]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::uint64_t { return i + 1 < argc ? std::strtoull(argv[++i], nullptr, 10) : 0; };
    if (a == "--mib-per-mode") o.mib_per_mode = next();
    else if (a == "--entry-mib") o.entry_mib = next();
    else if (a == "--frame-kib") o.frame_kib = static_cast<std::uint32_t>(next());
    else if (a == "--pinned-kib") o.pinned_kib = static_cast<std::uint32_t>(next());
    else if (a == "--depth") o.depth = static_cast<std::uint32_t>(next());
    else if (a == "--link" && i + 1 < argc) o.tcp = std::string(argv[++i]) == "tcp";
    else if (a == "--emulated") o.emulated = true;
    else if (a == "--require-device") o.require_device = true;
    else return usage();
  }
  if (o.entry_mib == 0 || o.mib_per_mode < o.entry_mib || o.frame_kib == 0 || o.pinned_kib == 0 ||
      o.depth == 0)
    return usage();
  if (o.emulated) cuda::testing::use_emulated_runtime(true);
  auto n = cuda::device_count();
  if (!n) {
    std::printf("SKIP: no device: %s\n", n.message().c_str());
    return o.require_device ? 3 : 0;
  }
  const std::uint64_t entry = o.entry_mib << 20;
  const std::uint64_t count = o.mib_per_mode / o.entry_mib;
  const std::uint64_t total = entry * count;
  std::printf("blobpipe CUDA streaming: %s, %llu MiB per mode as %llu entries of %llu MiB; frame %u KiB, "
              "pinned %u KiB x %u\n",
              o.tcp ? "TCP 127.0.0.1" : "loopback", (unsigned long long)(total >> 20),
              (unsigned long long)count, (unsigned long long)o.entry_mib, o.frame_kib, o.pinned_kib,
              o.depth);
  std::printf("%s; device 0: %s%s\n", cuda::version_string().c_str(),
              cuda::describe_device(0).value().c_str(), o.emulated ? " (EMULATED: numbers are meaningless)" : "");

  std::vector<std::byte> host(entry);
  for (std::uint64_t i = 0; i < entry; ++i) host[i] = std::byte((i * 2654435761u) >> 13);
  auto dev_src = cuda::device_buffer::allocate(entry).value();
  dev_src.copy_from_host(host).value();
  auto dev_dst = cuda::device_buffer::allocate(entry).value();
  auto pinned = cuda::pinned_buffer::allocate(entry).value();
  std::vector<std::byte> host_dst(entry);

  const double d2h_copy =
      copy_seconds("cudaMemcpy D2H", pinned.data(), dev_src.data(), entry, count);
  const double h2d_copy =
      copy_seconds("cudaMemcpy H2D", dev_dst.data(), pinned.data(), entry, count);
  const double d2d_copy =
      copy_seconds("cudaMemcpy D2D", dev_dst.data(), dev_src.data(), entry, count);
  std::memcpy(host_dst.data(), host.data(), entry);  // fault pages in
  const auto t0 = clock_type::now();
  for (std::uint64_t i = 0; i < count; ++i) std::memcpy(host_dst.data(), host.data(), entry);
  const double memcpy_s = seconds_since(t0);

  const mode modes[] = {
      {"d2h", "device -> sender (pinned staging) -> consumer host", end::device, end::host},
      {"h2d", "host -> consumer landing (pinned staging) -> device", end::host, end::device},
      {"d2d", "device -> sender -> consumer landing -> device", end::device, end::device},
      {"h2h", "host -> consumer host (no CUDA)", end::host, end::host},
  };
  const double reference[] = {d2h_copy, h2d_copy, d2d_copy, memcpy_s};
  const char* reference_name[] = {"cudaMemcpy D2H (pinned)", "cudaMemcpy H2D (pinned)",
                                  "cudaMemcpy D2D", "memcpy"};
  std::printf("\n%-5s %-55s %10s   %-24s %10s\n", "mode", "path", "blobpipe", "same bytes by", "GB/s");
  int failed = 0;
  for (std::size_t k = 0; k < std::size(modes); ++k) {
    const auto& m = modes[k];
    const std::byte* src = m.from == end::device ? dev_src.data() : host.data();
    (void)stream(o, m, src, entry, 1, host);  // warm up: rings, pools, page faults
    const double s = stream(o, m, src, entry, count, host);
    if (s < 0) {
      ++failed;
      continue;
    }
    // A reference copy that failed is a failure too, not 0.00 GB/s.
    char ref[32] = "FAILED";
    if (reference[k] < 0) ++failed;
    else std::snprintf(ref, sizeof ref, "%6.2f GB/s", gbps(total, reference[k]));
    std::printf("%-5s %-55s %6.2f GB/s   %-24s %11s\n", m.name, m.path, gbps(total, s),
                reference_name[k], ref);
  }
  std::printf("\nGB/s = 1e9 bytes/s. blobpipe: first emit to last entry in place, entries "
              "released as they arrive (device landing: cudaMalloc/cudaFree per entry).\n");
  return failed == 0 ? 0 : 1;
}
