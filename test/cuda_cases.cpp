// The CUDA test bodies (test/cuda_cases.hpp): device values through the
// sender, entries landing in device memory at the consumer, the no-device
// errors, and failures injected into the emulator.
#include "test/cuda_cases.hpp"

#include <cstring>
#include <exception>
#include <memory>
#include <optional>

#include "blobpipe/cuda.hpp"
#include "lib/cuda/testing.hpp"
#include "test/cuda_case_util.hpp"

namespace blobpipe::cuda_cases {
namespace {

using namespace blobpipe::testing;

std::string no_device(backend) {
  return cuda::device_available() ? "a CUDA device is present; this case checks the no-device errors"
                                  : std::string();
}

// ---- cases: no device ----

void no_device_errors(checker& ck, backend) {
  int x = 42;
  auto loc = cuda::locate(&x, memory_kind::cuda_device);
  BLOBPIPE_EXPECT(ck, loc.code() == errc::cuda_failure, loc.message());
  const bool says_why = loc.message().find("no CUDA device") != std::string::npos ||
                        loc.message().find("built without CUDA") != std::string::npos;
  BLOBPIPE_EXPECT(ck, says_why, loc.message());
  BLOBPIPE_EXPECT(ck, cuda::device_count().code() == errc::cuda_failure, "device_count");
  BLOBPIPE_EXPECT(ck, !cuda::device_available(), "device_available");
  BLOBPIPE_EXPECT(ck, cuda::device_buffer::allocate(64).code() == errc::cuda_failure, "allocate");
  // automatic: with no device, any pointer is host memory (documented).
  auto a = cuda::locate(&x, memory_kind::automatic);
  BLOBPIPE_EXPECT(ck, a && a->kind == memory_kind::host, a.message());

  // The sender: a declared device value fails before anything is sent,
  // the blob stays usable, and the consumer sees a clean blob.
  runner r;
  auto ep = r.await(connect(link_kind::loopback));
  std::vector<float> host = {1, 2, 3, 4};
  received got;
  std::error_code dev_ec;
  std::string dev_msg;
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob();
    value v = value::tensor(host);
    v.memory = memory_kind::cuda_device;
    dev_ec = co_await blob.emit("on_device", v);
    dev_msg = blob.last_error();
    BLOBPIPE_EXPECT(ck, !co_await blob.emit("on_host", value::tensor(host)), "host emit");
    BLOBPIPE_EXPECT(ck, blob.last_error().empty(), blob.last_error());
    BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
    BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), "shutdown");
  };
  r.spawn(produce());
  r.spawn(collect(ep.c, got));
  BLOBPIPE_EXPECT(ck, r.run(), "run finished");
  BLOBPIPE_EXPECT(ck, dev_ec == errc::cuda_failure, dev_ec.message());
  BLOBPIPE_EXPECT(ck, dev_msg.find("no CUDA device") != std::string::npos ||
                          dev_msg.find("built without CUDA") != std::string::npos,
                  dev_msg);
  BLOBPIPE_EXPECT(ck, got.entries.size() == 1 && got.entries[0]->entry.key == "on_host",
                  "one host entry");
  BLOBPIPE_EXPECT(ck, got.ends.size() == 1 && got.ends[0].kind == event_kind::blob_complete,
                  "blob complete");
  BLOBPIPE_EXPECT(ck, !got.last.error, got.last.reason);
  BLOBPIPE_EXPECT(ck, ep.s.stats().device_entries == 0, "no device entries");

  // The consumer: landing without a device fails at start.
  auto [a2, b2] = loopback::make_pair(r.ex());
  consumer_options copt;
  copt.landing.enabled = true;
  auto [cec, c] = r.await(consumer::start(std::move(b2), copt));
  BLOBPIPE_EXPECT(ck, cec == errc::cuda_failure, cec.message());
}

// version_string() names the runtime in use: the emulated one says so, so
// that a log of a run on it cannot be read as a run on a device.
void version_names_the_runtime(checker& ck, backend b) {
  const std::string v = cuda::version_string();
  if (b == backend::emulated) {
    BLOBPIPE_EXPECT(ck, v.find("emulated CUDA") == 0, v);
  } else {
    BLOBPIPE_EXPECT(ck, v.find("CUDA runtime") == 0 || v == "built without CUDA", v);
  }
}

// ---- cases: host values unaffected ----

void automatic_host_pointer_takes_host_path(checker& ck, backend) {
  std::vector<float> host(1000);
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = float(i) * 0.5f;
  auto loc = cuda::locate(host.data(), memory_kind::automatic);
  BLOBPIPE_EXPECT(ck, loc && loc->kind == memory_kind::host, loc.message());
  for (link_kind l : both_links) {
    runner r;
    consumer_options copt;
    copt.assemble = assemble_mode::memory;
    copt.max_blob_bytes = 1 << 20;
    auto ep = r.await(connect(l, copt, sender_opts(512)));
    const tag_t tag = random_tag();
    value v = value::tensor(host);
    v.memory = memory_kind::automatic;
    received got;
    auto produce = [&]() -> asio::awaitable<void> {
      auto blob = ep.s.open_blob(tag);
      BLOBPIPE_EXPECT(ck, !co_await blob.emit("x", v), "emit");
      BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
      BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), "shutdown");
    };
    r.spawn(produce());
    r.spawn(collect(ep.c, got));
    BLOBPIPE_EXPECT(ck, r.run(), "run finished");
    BLOBPIPE_EXPECT(ck, ep.s.stats().device_entries == 0, link_name(l));
    const auto want = expected_blob({"x"}, {value::tensor(host)}, tag);
    BLOBPIPE_EXPECT(ck, got.ends.size() == 1 && same(got.ends[0].blob->bytes, want), link_name(l));
  }
}

void write_refuses_declared_device_value(checker& ck, backend) {
  std::vector<float> host = {1, 2};
  value v = value::tensor(host);
  v.memory = memory_kind::cuda_device;
  auto p = plan({"x"}, {v});
  BLOBPIPE_EXPECT(ck, p.has_value(), "plan is the same for device values");
  if (!p) return;
  std::vector<std::byte> out(p->nbytes);
  auto w = write(*p, out);
  BLOBPIPE_EXPECT(ck, w.code() == errc::invalid_argument, w.message());
}

}  // namespace

// Device cases live in test/cuda_device_cases.cpp.
std::vector<test_case> device_cases();

const std::vector<test_case>& all() {
  static const std::vector<test_case> cases = [] {
    std::vector<test_case> v = {
        {"no_device_gives_cuda_failure_and_blob_stays_usable", {backend::real}, &no_device,
         &no_device_errors},
        {"version_names_the_runtime", {backend::real, backend::emulated}, &nothing,
         &version_names_the_runtime},
        {"automatic_on_host_pointer_takes_host_path", {backend::real, backend::emulated},
         &nothing, &automatic_host_pointer_takes_host_path},
        {"write_refuses_declared_device_value", {backend::real}, &nothing,
         &write_refuses_declared_device_value},
    };
    for (auto& c : device_cases()) v.push_back(c);
    return v;
  }();
  return cases;
}

std::string why_skip(const test_case& c, backend b) {
  cuda::testing::use_emulated_runtime(b == backend::emulated);
  auto why = c.needs(b);
  cuda::testing::use_emulated_runtime(false);
  return why;
}

outcome run(const test_case& c, backend b) {
  cuda::testing::use_emulated_runtime(b == backend::emulated);
  struct restore {
    ~restore() {
      cuda::testing::fail_copy_after(-1);
      cuda::testing::use_emulated_runtime(false);
    }
  } restore_runtime;
  outcome out;
  if (auto why = c.needs(b); !why.empty()) {
    out.result = outcome::status::skip;
    out.detail = why;
    return out;
  }
  const std::size_t live_before = cuda::testing::live_device_allocations();
  checker ck;
  try {
    c.body(ck, b);
  } catch (const std::exception& e) {
    ck.failures.push_back(std::string("exception: ") + e.what());
  }
  if (b == backend::emulated && cuda::testing::live_device_allocations() != live_before)
    ck.failures.push_back("emulated device memory leaked: " +
                          std::to_string(cuda::testing::live_device_allocations() - live_before) +
                          " allocation(s)");
  if (!ck.failures.empty()) {
    out.result = outcome::status::fail;
    for (auto& f : ck.failures) out.detail += f + "\n";
  }
  return out;
}

}  // namespace blobpipe::cuda_cases
