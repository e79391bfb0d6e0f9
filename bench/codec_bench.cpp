// bench/codec_bench.cpp — codec throughput against memcpy.
//
//   bazel run -c opt //bench:codec_bench
//
// 1. Large tensors: `write` of 8 x 64 MiB float32 tensors into one blob
//    versus memcpy of the same bytes to the same offsets. write should be
//    copy-bound, so the target is >= 0.8x memcpy. Best of a few runs each,
//    interleaved so both see the same machine state.
// 2. Small entries: plan() + write() of 10,000 64-byte tensors per
//    iteration, reported as entries/s (the per-entry overhead of building
//    and encoding the index).
//
// Prints PASS/MISS against the target but always exits 0: a benchmark
// reports, it never gates (STYLE.md rule 18). Peak memory is about 1 GiB
// (sources + one blob buffer, reused as the memcpy destination).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "blobpipe/format.hpp"

namespace {

namespace bp = blobpipe;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t mib = std::size_t{1} << 20;
constexpr std::size_t large_tensors = 8;
constexpr std::size_t large_tensor_bytes = 64 * mib;
constexpr int large_reps = 5;
constexpr double target_ratio = 0.8;

constexpr std::size_t small_entries = 10'000;
constexpr std::size_t small_entry_bytes = 64;
constexpr int small_min_reps = 5;
constexpr double small_budget_s = 3.0;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Keeps the compiler from discarding copies whose result nobody reads.
volatile std::uint8_t sink;
void consume(std::span<const std::byte> b) {
  if (!b.empty()) sink = static_cast<std::uint8_t>(b[b.size() / 2]) ^ static_cast<std::uint8_t>(b.back());
}

void bench_large() {
  const std::size_t elems = large_tensor_bytes / sizeof(float);
  std::vector<std::vector<float>> sources(large_tensors);
  std::vector<std::string> keys;
  std::vector<bp::value> values;
  for (std::size_t t = 0; t < large_tensors; ++t) {
    // Distinct non-zero contents, so every source page is really resident.
    sources[t].resize(elems);
    for (std::size_t i = 0; i < elems; ++i) sources[t][i] = static_cast<float>(i % 1021) + t;
    keys.push_back("layer" + std::to_string(t) + ".weight");
    values.push_back(bp::value::tensor(sources[t]));
  }
  auto p = bp::plan(std::span<const std::string>(keys), std::span<const bp::value>(values));
  if (!p) {
    std::printf("  plan failed: %s: %s\n", bp::errc_name(p.code()), p.message().c_str());
    return;
  }
  // Value-initialised, so the destination pages are faulted in before any
  // timed run (neither side pays for first touch).
  std::vector<std::byte> blob(p->nbytes);
  const std::uint64_t data_bytes = large_tensors * large_tensor_bytes;

  double best_write = 1e30, best_memcpy = 1e30;
  for (int rep = 0; rep < large_reps; ++rep) {
    auto t0 = clock_type::now();
    for (const auto& pe : p->entries) {
      std::memcpy(blob.data() + pe.entry.off, pe.source.data, pe.entry.len);
    }
    best_memcpy = std::min(best_memcpy, seconds_since(t0));
    consume(blob);

    t0 = clock_type::now();
    auto w = bp::write(*p, blob);
    best_write = std::min(best_write, seconds_since(t0));
    if (!w) {
      std::printf("  write failed: %s: %s\n", bp::errc_name(w.code()), w.message().c_str());
      return;
    }
    consume(blob);
  }
  const double memcpy_gbs = data_bytes / best_memcpy / 1e9;
  const double write_gbs = data_bytes / best_write / 1e9;
  const double ratio = write_gbs / memcpy_gbs;
  std::printf("[1] write vs memcpy: %zu x %zu MiB float32 -> one blob of %llu bytes, best of %d\n",
              large_tensors, large_tensor_bytes / mib,
              static_cast<unsigned long long>(p->nbytes), large_reps);
  std::printf("    memcpy        %7.2f GB/s  (%.1f ms)\n", memcpy_gbs, best_memcpy * 1e3);
  std::printf("    write         %7.2f GB/s  (%.1f ms)\n", write_gbs, best_write * 1e3);
  std::printf("    write/memcpy  %7.2fx      target >= %.2fx: %s\n", ratio, target_ratio,
              ratio >= target_ratio ? "PASS" : "MISS");
}

void bench_small() {
  std::vector<std::byte> payload(small_entries * small_entry_bytes);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 31);
  std::vector<std::string> keys;
  std::vector<bp::value> values;
  keys.reserve(small_entries);
  values.reserve(small_entries);
  for (std::size_t i = 0; i < small_entries; ++i) {
    keys.push_back(std::to_string(i) + "@reward");
    auto bytes = std::span<const std::byte>(payload).subspan(i * small_entry_bytes, small_entry_bytes);
    values.push_back(bp::value::tensor_bytes(bytes, "float32", {small_entry_bytes / 4}));
  }

  // One untimed plan sizes the output buffer (every iteration plans the
  // same layout), so the timed loop allocates only what plan() itself does.
  auto first = bp::plan(std::span<const std::string>(keys), std::span<const bp::value>(values));
  if (!first) {
    std::printf("  plan failed: %s: %s\n", bp::errc_name(first.code()), first.message().c_str());
    return;
  }
  const std::uint64_t nbytes = first->nbytes;
  std::vector<std::byte> blob(nbytes);

  double best_total = 1e30, best_plan = 1e30, best_write = 1e30;
  int reps = 0;
  const auto start = clock_type::now();
  while (reps < small_min_reps || seconds_since(start) < small_budget_s) {
    const auto t0 = clock_type::now();
    auto p = bp::plan(std::span<const std::string>(keys), std::span<const bp::value>(values));
    const auto t1 = clock_type::now();
    auto w = p ? bp::write(*p, blob) : bp::result<std::uint64_t>(p.err());
    const auto t2 = clock_type::now();
    if (!w) {
      std::printf("  plan/write failed: %s: %s\n", bp::errc_name(w.code()), w.message().c_str());
      return;
    }
    consume(blob);
    best_plan = std::min(best_plan, std::chrono::duration<double>(t1 - t0).count());
    best_write = std::min(best_write, std::chrono::duration<double>(t2 - t1).count());
    best_total = std::min(best_total, std::chrono::duration<double>(t2 - t0).count());
    ++reps;
  }
  std::printf("[2] plan+write: %zu entries x %zu B per blob (%llu bytes), best of %d\n",
              small_entries, small_entry_bytes, static_cast<unsigned long long>(nbytes), reps);
  std::printf("    plan+write    %10.0f entries/s  (%.2f ms per blob)\n",
              small_entries / best_total, best_total * 1e3);
  std::printf("    plan only     %10.0f entries/s  (%.2f ms)\n", small_entries / best_plan,
              best_plan * 1e3);
  std::printf("    write only    %10.0f entries/s  (%.2f ms)\n", small_entries / best_write,
              best_write * 1e3);
}

}  // namespace

int main() {
  std::printf("codec_bench: blobpipe NVDP v3 codec, %u hardware threads\n",
              std::thread::hardware_concurrency());
  bench_large();
  bench_small();
  return 0;
}
