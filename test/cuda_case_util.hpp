// test/cuda_case_util.hpp — helpers for the CUDA test bodies
// (test/cuda_cases.cpp, test/cuda_device_cases.cpp): device copies of test
// bytes, a consumer drain, and the blob write(plan) would make.
#pragma once

#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "blobpipe/cuda.hpp"
#include "lib/cuda/handles.hpp"
#include "test/cuda_cases.hpp"
#include "test/pipeline_fixture.hpp"

namespace blobpipe::cuda_cases {

inline const testing::link_kind both_links[] = {testing::link_kind::loopback,
                                               testing::link_kind::tcp};

/// sender_options with a frame size and staging (no designated
/// initializers: -Wmissing-field-initializers).
inline sender_options sender_opts(std::uint32_t chunk, cuda::staging_options staging = {}) {
  sender_options o;
  o.chunk_bytes = chunk;
  o.staging = staging;
  return o;
}

inline std::string nothing(backend) { return {}; }

/// Skips (with CUDA's reason) when there is no device.
inline std::string a_device(backend) {
  auto n = cuda::device_count();
  return n ? std::string() : "no device: " + n.message();
}

/// The emulator's failure injection is the point of the case.
inline std::string emulator_only(backend b) {
  return b == backend::emulated ? std::string() : "needs the emulator's failure injection";
}

inline std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::byte((i * 131u + seed * 7u + (i >> 8)) & 0xff);
  return v;
}

inline cuda::device_buffer on_device(std::span<const std::byte> host) {
  auto b = cuda::device_buffer::allocate(host.size()).value();
  b.copy_from_host(host).value();
  return b;
}

inline std::vector<std::byte> to_host(const cuda::device_view& v) {
  std::vector<std::byte> out(v.nbytes);
  if (v.nbytes == 0) return out;
  // The entry's bytes are exactly its device buffer.
  cuda::copy_sync(out.data(), v.data, v.nbytes).value();
  return out;
}

inline bool same(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

inline value device_value(const cuda::device_buffer& b, std::string dtype, shape_t shape,
                   memory_kind kind = memory_kind::cuda_device) {
  value v = value::tensor_bytes(std::span<const std::byte>(b.data(), b.size()), std::move(dtype),
                                std::move(shape));
  v.memory = kind;
  return v;
}

/// Everything a consumer yielded until end_of_stream.
struct received {
  std::vector<std::shared_ptr<const received_entry>> entries;
  std::vector<event> ends;  // blob_complete and blob_aborted
  event last;
};

inline asio::awaitable<void> collect(consumer& c, received& out) {
  for (;;) {
    auto ev = co_await c.next();
    if (ev.kind == event_kind::entry_ready) out.entries.push_back(ev.entry);
    else if (ev.kind == event_kind::end_of_stream) {
      out.last = std::move(ev);
      co_return;
    } else {
      out.ends.push_back(std::move(ev));
    }
  }
}

/// The blob write(plan) makes from host copies of the values.
inline std::vector<std::byte> expected_blob(const std::vector<std::string>& keys,
                                     const std::vector<value>& host_values, const tag_t& tag) {
  auto p = plan(keys, host_values, tag).value();
  std::vector<std::byte> out(p.nbytes);
  (void)write(p, out).value();
  return out;
}

}  // namespace blobpipe::cuda_cases
