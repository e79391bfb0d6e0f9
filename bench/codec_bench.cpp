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
// 3. Reading: parse_index of a 10,000-row index (the rows of [2]) as
//    rows/s, and Entry::from_meta of a typical meta map (float32 [16]) as
//    metas/s: the per-row and per-entry parsing cost a streaming consumer
//    pays.
//
//   codec_bench [large] [small] [parse]    # sections to run; default all
//
// Prints PASS/MISS against the target but always exits 0: a benchmark
// reports, it never gates (CONTRIBUTING.md "Benchmarks"). Peak memory is about 1 GiB
// (sources + one blob buffer, reused as the memcpy destination) with
// [large], a few MiB without it.
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

constexpr std::size_t meta_batch = 10'000;  // from_meta calls per timed run
constexpr double parse_budget_s = 2.0;       // per measurement

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

// Best seconds of `run` over as many runs as fit in parse_budget_s (at
// least small_min_reps); `run` returns false when the codec failed.
template <class Run>
double best_of(Run run) {
  double best = 1e30;
  int reps = 0;
  const auto start = clock_type::now();
  while (reps < small_min_reps || seconds_since(start) < parse_budget_s) {
    const auto t0 = clock_type::now();
    if (!run()) return -1;
    best = std::min(best, seconds_since(t0));
    ++reps;
  }
  return best;
}

void bench_parse() {
  // The index of [2]'s blob: 10,000 rows "N@reward", float32 [16].
  std::vector<bp::Entry> rows;
  rows.reserve(small_entries);
  for (std::size_t i = 0; i < small_entries; ++i)
    rows.push_back({std::to_string(i) + "@reward", i * small_entry_bytes, small_entry_bytes, 't',
                    std::string("float32"), bp::shape_t{small_entry_bytes / 4}});
  const std::vector<std::byte> index = bp::encode_index(rows);
  const std::uint64_t data_end = small_entries * small_entry_bytes;
  std::size_t parsed = 0;
  const double index_s = best_of([&] {
    auto r = bp::parse_index(index, data_end);
    if (!r) {
      std::printf("  parse_index failed: %s: %s\n", bp::errc_name(r.code()), r.message().c_str());
      return false;
    }
    parsed = r->size();
    return true;
  });
  if (index_s < 0) return;

  const std::vector<std::byte> meta = rows[0].meta();
  const std::string key = rows[0].key;
  std::uint64_t check = 0;
  const double meta_s = best_of([&] {
    for (std::size_t i = 0; i < meta_batch; ++i) {
      auto e = bp::Entry::from_meta(key, meta);
      if (!e) {
        std::printf("  from_meta failed: %s: %s\n", bp::errc_name(e.code()), e.message().c_str());
        return false;
      }
      check += e->len;
    }
    return true;
  });
  if (meta_s < 0) return;
  sink = static_cast<std::uint8_t>(check);
  std::printf("[3] parse: index of %zu rows (%zu bytes); meta map of %zu bytes, best runs\n",
              parsed, index.size(), meta.size());
  std::printf("    parse_index   %10.0f rows/s     (%.2f ms per index)\n", parsed / index_s,
              index_s * 1e3);
  std::printf("    from_meta     %10.0f metas/s    (%.0f ns per meta)\n", meta_batch / meta_s,
              meta_s / meta_batch * 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  bool large = argc == 1, small = argc == 1, parse = argc == 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "large") {
      large = true;
    } else if (a == "small") {
      small = true;
    } else if (a == "parse") {
      parse = true;
    } else {
      std::fprintf(stderr, "usage: codec_bench [large] [small] [parse]\n");
      return 1;
    }
  }
  std::printf("codec_bench: blobpipe NVDP v3 codec, %u hardware threads\n",
              std::thread::hardware_concurrency());
  if (large) bench_large();
  if (small) bench_small();
  if (parse) bench_parse();
  return 0;
}
