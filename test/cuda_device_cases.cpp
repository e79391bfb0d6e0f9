// CUDA test bodies that need a device (real, or the emulator): device
// values staged through pinned buffers, entries landing in device memory,
// device-to-device, strided device values, the pool, injected failures,
// and a transport that takes device memory itself.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "lib/cuda/staging.hpp"
#include "lib/cuda/testing.hpp"
#include "test/cuda_case_util.hpp"
#include "test/forwarding_transport.hpp"
#include "test/frame_scanner.hpp"

namespace blobpipe::cuda_cases {
namespace {

using namespace blobpipe::testing;

// Named, not literals: GCC 12 rejects a string literal argument inside a
// co_await expression ("array used as initializer").
const std::string u8 = "uint8";
const std::string key_x = "x";

void device_buffer_round_trip(checker& ck, backend) {
  const auto host = pattern(5000, 1);
  auto b = on_device(host);
  std::vector<std::byte> back(host.size());
  b.copy_to_host(back).value();
  BLOBPIPE_EXPECT(ck, same(back, host), "round trip");
  std::vector<std::byte> part(100);
  b.copy_to_host(part, 4900).value();
  BLOBPIPE_EXPECT(ck, same(part, std::span(host).subspan(4900)), "tail");
  BLOBPIPE_EXPECT(ck, b.copy_to_host(part, 4901).code() == errc::invalid_argument, "past end");
  auto loc = cuda::locate(b.data(), memory_kind::automatic);
  BLOBPIPE_EXPECT(ck, loc && loc->kind == memory_kind::cuda_device && loc->device == 0,
                  loc.message());
  auto declared = cuda::locate(host.data(), memory_kind::cuda_device);
  BLOBPIPE_EXPECT(ck, declared.code() == errc::invalid_argument, "host memory declared device");
  auto empty = cuda::device_buffer::allocate(0).value();
  BLOBPIPE_EXPECT(ck, empty.data() == nullptr && empty.size() == 0, "empty buffer");
}

/// cuda.hpp describe_device: a device number from 0 to device_count() - 1
/// is described; one past the last, or negative, is invalid_argument.
void describe_device_takes_only_devices_that_exist(checker& ck, backend) {
  const int n = cuda::device_count().value();
  BLOBPIPE_EXPECT(ck, cuda::describe_device(n - 1).has_value(), "the last device");
  auto past = cuda::describe_device(n);
  BLOBPIPE_EXPECT(ck, past.code() == errc::invalid_argument, "device " + std::to_string(n));
  auto negative = cuda::describe_device(-1);
  BLOBPIPE_EXPECT(ck, negative.code() == errc::invalid_argument, "device -1");
}

void staging_pool_reuses_rings(checker& ck, backend) {
  cuda::staging_pool pool;
  {
    auto a = pool.acquire(0, 4096, 3).value();
    BLOBPIPE_EXPECT(ck, a->depth() == 3 && a->slot_bytes() == 4096, "shape");
    auto b = pool.acquire(0, 4096, 3).value();  // a is lent: a second ring
  }
  BLOBPIPE_EXPECT(ck, pool.rings_created() == 2 && pool.idle_rings() == 2, "two back");
  { auto c = pool.acquire(0, 4096, 3).value(); }
  { auto d = pool.acquire(0, 8192, 3).value(); }  // another size: a new ring
  BLOBPIPE_EXPECT(ck, pool.rings_created() == 3, std::to_string(pool.rings_created()));
}

/// Device values of several sizes over both links and two shapes of
/// staging: the assembled blob equals write(plan) of the host bytes.
void device_values_arrive_byte_identical(checker& ck, backend) {
  struct config {
    std::uint32_t frame;
    cuda::staging_options staging;
  };
  const config configs[] = {{1024, {.pinned_chunk_bytes = 4096, .pool_depth = 3}},
                            {4096, {.pinned_chunk_bytes = 1000, .pool_depth = 2}}};
  const std::vector<std::size_t> sizes = {0, 1, 4097, 100000, 64};
  std::vector<std::vector<std::byte>> host;
  std::vector<cuda::device_buffer> dev;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    host.push_back(pattern(sizes[i], unsigned(i)));
    dev.push_back(on_device(host.back()));
  }
  for (const auto& cfg : configs) {
    for (link_kind l : both_links) {
      const std::string where = std::string(link_name(l)) + " frame " + std::to_string(cfg.frame);
      runner r;
      consumer_options copt;
      copt.assemble = assemble_mode::memory;
      copt.max_blob_bytes = 1 << 20;
      auto ep = r.await(connect(l, copt, sender_opts(cfg.frame, cfg.staging)));
      const tag_t tag = random_tag();
      std::vector<std::string> keys;
      std::vector<value> host_values, dev_values;
      for (std::size_t i = 0; i < host.size(); ++i) {
        keys.push_back("e" + std::to_string(i));
        host_values.push_back(value::tensor_bytes(host[i], u8, {std::int64_t(sizes[i])}));
        dev_values.push_back(device_value(dev[i], u8, {std::int64_t(sizes[i])}));
      }
      received got;
      auto produce = [&]() -> asio::awaitable<void> {
        auto blob = ep.s.open_blob(tag);
        for (std::size_t i = 0; i < dev.size(); ++i) {
          auto ec = co_await blob.emit(keys[i], dev_values[i]);
          BLOBPIPE_EXPECT(ck, !ec, where + " emit " + keys[i] + ": " + blob.last_error());
        }
        BLOBPIPE_EXPECT(ck, !co_await blob.finish(), where);
        BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), where);
      };
      r.spawn(produce());
      r.spawn(collect(ep.c, got));
      BLOBPIPE_EXPECT(ck, r.run(), where + " finished");
      const auto want = expected_blob(keys, host_values, tag);
      BLOBPIPE_EXPECT(ck, got.ends.size() == 1 && got.ends[0].kind == event_kind::blob_complete,
                      where);
      if (got.ends.size() == 1 && got.ends[0].blob)
        BLOBPIPE_EXPECT(ck, same(got.ends[0].blob->bytes, want), where + " bytes");
      const auto st = ep.s.stats();
      std::uint64_t chunks = 0;
      for (auto n : sizes) chunks += (n + cfg.staging.pinned_chunk_bytes - 1) / cfg.staging.pinned_chunk_bytes;
      BLOBPIPE_EXPECT(ck, st.device_entries == sizes.size(), where);
      BLOBPIPE_EXPECT(ck, st.device_chunks == chunks,
                      where + " chunks " + std::to_string(st.device_chunks));
      // Never more in flight than the ring has slots besides the one on
      // the wire. How many actually are depends on how fast the copies run
      // (staging_keeps_copies_in_flight_while_sending holds them to count).
      BLOBPIPE_EXPECT(ck, st.device_prefetch_high_water <= cfg.staging.pool_depth - 1,
                      where + " overlap " + std::to_string(st.device_prefetch_high_water));
    }
  }
}

/// A resend session keeps a host copy of every entry until its blob is
/// acknowledged: device values are copied to the host at emit and arrive
/// byte-identical (docs/cuda.md "Transports", resend sessions).
void device_values_arrive_through_a_resend_session(checker& ck, backend) {
  const std::vector<std::size_t> sizes = {0, 1, 4097, 100000};
  std::vector<std::vector<std::byte>> host;
  std::vector<cuda::device_buffer> dev;
  std::vector<std::string> keys;
  std::vector<value> host_values, dev_values;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    host.push_back(pattern(sizes[i], unsigned(i) + 20));
    dev.push_back(on_device(host.back()));
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    keys.push_back("r" + std::to_string(i));
    host_values.push_back(value::tensor_bytes(host[i], u8, {std::int64_t(sizes[i])}));
    dev_values.push_back(device_value(dev[i], u8, {std::int64_t(sizes[i])}));
  }
  runner r;
  auto [a, b] = r.await(raw_pair(link_kind::loopback));
  // One connection; a reconnect would find nothing (and the test fail).
  auto first = std::make_shared<std::unique_ptr<transport>>(std::move(a));
  connect_fn once = [first]() -> asio::awaitable<
                                   std::tuple<std::error_code, std::unique_ptr<transport>>> {
    if (!*first) co_return std::tuple{make_error_code(errc::peer_failed), nullptr};
    co_return std::tuple{std::error_code{}, std::move(*first)};
  };
  consumer_options copt;
  copt.assemble = assemble_mode::memory;
  copt.max_blob_bytes = 1 << 20;
  std::optional<consumer> c;
  std::optional<sender> s;
  received got;
  const tag_t tag = random_tag();
  auto consume = [&]() -> asio::awaitable<void> {
    auto [ec, started] = co_await consumer::start(std::move(b), copt);
    BLOBPIPE_EXPECT(ck, !ec, "consumer start: " + ec.message());
    if (ec) co_return;
    c.emplace(std::move(started));
    co_await collect(*c, got);
  };
  auto produce = [&]() -> asio::awaitable<void> {
    auto [ec, started] = co_await sender::start(once, sender_opts(4096));
    BLOBPIPE_EXPECT(ck, !ec, "resend start: " + ec.message());
    if (ec) co_return;
    s.emplace(std::move(started));
    auto blob = s->open_blob(tag);
    for (std::size_t i = 0; i < dev.size(); ++i) {
      auto eec = co_await blob.emit(keys[i], dev_values[i]);
      BLOBPIPE_EXPECT(ck, !eec, "emit " + keys[i] + ": " + blob.last_error());
    }
    BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
    BLOBPIPE_EXPECT(ck, !co_await s->shutdown(), "shutdown");
  };
  r.spawn(consume());
  r.spawn(produce());
  BLOBPIPE_EXPECT(ck, r.run(), "finished");
  const auto want = expected_blob(keys, host_values, tag);
  BLOBPIPE_EXPECT(ck, got.ends.size() == 1 && got.ends[0].kind == event_kind::blob_complete,
                  "one blob complete");
  if (got.ends.size() == 1 && got.ends[0].blob)
    BLOBPIPE_EXPECT(ck, same(got.ends[0].blob->bytes, want), "bytes");
  BLOBPIPE_EXPECT(ck, s && s->stats().device_entries == sizes.size(),
                  "device entries " + std::to_string(s ? s->stats().device_entries : 0));
}

void automatic_device_pointer_takes_device_path(checker& ck, backend) {
  const auto host = pattern(3000, 9);
  auto dev = on_device(host);
  runner r;
  auto ep = r.await(connect(link_kind::loopback));
  received got;
  const value v = device_value(dev, u8, {3000}, memory_kind::automatic);
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob();
    BLOBPIPE_EXPECT(ck, !co_await blob.emit("x", v), blob.last_error());
    BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
    BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), "shutdown");
  };
  r.spawn(produce());
  r.spawn(collect(ep.c, got));
  BLOBPIPE_EXPECT(ck, r.run(), "finished");
  BLOBPIPE_EXPECT(ck, ep.s.stats().device_entries == 1, "staged");
  BLOBPIPE_EXPECT(ck, got.entries.size() == 1 && same(got.entries[0]->view.bytes, host), "bytes");
}

/// A transposed device matrix is gathered on the host in logical order.
void strided_device_value_is_gathered(checker& ck, backend) {
  std::vector<float> m(4 * 6);
  for (std::size_t i = 0; i < m.size(); ++i) m[i] = float(i);
  auto dev = on_device(std::as_bytes(std::span(m)));
  value t = device_value(dev, "float32", {6, 4});
  t.strides = {1, 6};  // m is 4x6 row-major; this is its transpose
  value host_t = value::tensor(m, {6, 4});
  host_t.strides = {1, 6};
  auto p = plan({"t"}, {host_t}).value();
  std::vector<std::byte> want(p.entries[0].entry.len);
  write_entry(p.entries[0], want).value();
  runner r;
  auto ep = r.await(connect(link_kind::loopback));
  received got;
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob();
    BLOBPIPE_EXPECT(ck, !co_await blob.emit("t", t), blob.last_error());
    BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
    BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), "shutdown");
  };
  r.spawn(produce());
  r.spawn(collect(ep.c, got));
  BLOBPIPE_EXPECT(ck, r.run(), "finished");
  BLOBPIPE_EXPECT(ck, ep.s.stats().gathered_entries == 1, "gathered");
  BLOBPIPE_EXPECT(ck, got.entries.size() == 1 && same(got.entries[0]->view.bytes, want),
                  "logical order");
}

/// Host values land in device memory; pickles stay on the host.
void consumer_lands_entries_in_device_memory(checker& ck, backend) {
  for (link_kind l : both_links) {
    runner r;
    consumer_options copt;
    copt.landing.enabled = true;
    copt.landing.pool_depth = 2;
    copt.max_chunk_bytes = 512;
    auto ep = r.await(connect(l, copt));
    std::vector<float> a(1000), b(7);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(i) / 3;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = -float(i);
    const auto pickled = pattern(700, 3);
    received got;
    const value va = value::tensor(a, {10, 100});
    const value vm = value::pickle(pickled);
    const value vb = value::tensor(b);
    const std::vector<float> none;
    const value v0 = value::tensor(none);
    auto produce = [&]() -> asio::awaitable<void> {
      auto blob = ep.s.open_blob();
      BLOBPIPE_EXPECT(ck, !co_await blob.emit("a", va), "a");
      BLOBPIPE_EXPECT(ck, !co_await blob.emit("meta", vm), "meta");
      BLOBPIPE_EXPECT(ck, !co_await blob.emit("b", vb), "b");
      BLOBPIPE_EXPECT(ck, !co_await blob.emit("empty", v0), "0");
      BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
      BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), "shutdown");
    };
    r.spawn(produce());
    r.spawn(collect(ep.c, got));
    BLOBPIPE_EXPECT(ck, r.run(), link_name(l));
    BLOBPIPE_EXPECT(ck, got.entries.size() == 4, link_name(l));
    BLOBPIPE_EXPECT(ck, got.ends.size() == 1 && got.ends[0].kind == event_kind::blob_complete,
                    link_name(l));
    if (got.entries.size() != 4) continue;
    const auto& ea = *got.entries[0];
    BLOBPIPE_EXPECT(ck, ea.memory == memory_kind::cuda_device && ea.view.bytes.empty(), "a on device");
    BLOBPIPE_EXPECT(ck, ea.device.nbytes == 4000 && ea.device.shape == shape_t({10, 100}) &&
                            ea.device.type.name == "float32" && ea.device.entry == &ea.entry,
                    "a view");
    BLOBPIPE_EXPECT(ck, same(to_host(ea.device), std::as_bytes(std::span(a))), "a bytes");
    const auto& em = *got.entries[1];
    BLOBPIPE_EXPECT(ck, em.memory == memory_kind::host && same(em.view.bytes, pickled), "meta host");
    const auto& eb = *got.entries[2];
    BLOBPIPE_EXPECT(ck, eb.memory == memory_kind::cuda_device &&
                            same(to_host(eb.device), std::as_bytes(std::span(b))),
                    "b bytes");
    const auto& e0 = *got.entries[3];
    BLOBPIPE_EXPECT(ck, e0.memory == memory_kind::cuda_device && e0.device.nbytes == 0, "empty");
    const auto cs = ep.c.stats();
    BLOBPIPE_EXPECT(ck, cs.device_entries == 3, std::to_string(cs.device_entries));
    BLOBPIPE_EXPECT(ck, cs.device_chunks == (4000 + 511) / 512 + 1,
                    std::to_string(cs.device_chunks));
  }
}

/// Device to device, from two producers at once (two staging rings).
void device_to_device_from_two_producers(checker& ck, backend) {
  std::vector<std::vector<std::byte>> host;
  std::vector<cuda::device_buffer> dev;
  for (unsigned i = 0; i < 6; ++i) {
    host.push_back(pattern(20000 + 333 * i, i));
    dev.push_back(on_device(host.back()));
  }
  std::vector<value> dev_values;
  for (unsigned i = 0; i < dev.size(); ++i)
    dev_values.push_back(device_value(dev[i], u8, {std::int64_t(host[i].size())}));
  for (link_kind l : both_links) {
    runner r;
    consumer_options copt;
    copt.landing.enabled = true;
    copt.landing.pool_depth = 3;
    auto ep = r.await(connect(l, copt, sender_opts(2048, {.pinned_chunk_bytes = 4096, .pool_depth = 3})));
    received got;
    int done = 0;
    auto produce = [&](unsigned k) -> asio::awaitable<void> {
      auto blob = ep.s.open_blob();
      for (unsigned i = k; i < dev.size(); i += 2)
        BLOBPIPE_EXPECT(ck, !co_await blob.emit(std::to_string(i), dev_values[i]),
                        blob.last_error());
      BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
      if (++done == 2) BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), "shutdown");
    };
    r.spawn(produce(0));
    r.spawn(produce(1));
    r.spawn(collect(ep.c, got));
    BLOBPIPE_EXPECT(ck, r.run(), link_name(l));
    BLOBPIPE_EXPECT(ck, got.entries.size() == dev.size() && got.ends.size() == 2, link_name(l));
    for (const auto& e : got.entries) {
      const auto i = std::stoul(e->entry.key);
      BLOBPIPE_EXPECT(ck, e->memory == memory_kind::cuda_device && same(to_host(e->device), host[i]),
                      std::string(link_name(l)) + " entry " + e->entry.key);
    }
    BLOBPIPE_EXPECT(ck, ep.s.stats().device_entries == dev.size(), link_name(l));
  }
}

/// A copy fails mid-entry: the blob is aborted with CUDA's message, the
/// sender goes on with the next blob on a fresh ring.
void failed_device_copy_aborts_blob(checker& ck, backend) {
  const auto host = pattern(40000, 5);
  auto dev = on_device(host);
  runner r;
  auto ep = r.await(connect(link_kind::loopback, {},
                            sender_opts(1024, {.pinned_chunk_bytes = 4096, .pool_depth = 2})));
  received got;
  const value v = device_value(dev, u8, {40000});
  auto produce = [&]() -> asio::awaitable<void> {
    auto first = ep.s.open_blob();
    cuda::testing::fail_copy_after(3);
    auto ec = co_await first.emit("x", v);
    BLOBPIPE_EXPECT(ck, ec == errc::cuda_failure, ec.message());
    BLOBPIPE_EXPECT(ck, first.last_error().find("illegal memory access") != std::string::npos,
                    first.last_error());
    BLOBPIPE_EXPECT(ck, co_await first.finish() == errc::closed, "first is over");
    auto second = ep.s.open_blob();
    BLOBPIPE_EXPECT(ck, !co_await second.emit("x", v),
                    second.last_error());
    BLOBPIPE_EXPECT(ck, !co_await second.finish(), "second");
    BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), "shutdown");
  };
  r.spawn(produce());
  r.spawn(collect(ep.c, got));
  BLOBPIPE_EXPECT(ck, r.run(), "finished");
  BLOBPIPE_EXPECT(ck, got.ends.size() == 2, std::to_string(got.ends.size()));
  if (got.ends.size() != 2) return;
  BLOBPIPE_EXPECT(ck, got.ends[0].kind == event_kind::blob_aborted &&
                          got.ends[0].reason.find("illegal memory access") != std::string::npos,
                  got.ends[0].reason);
  BLOBPIPE_EXPECT(ck, got.ends[1].kind == event_kind::blob_complete, "second complete");
  BLOBPIPE_EXPECT(ck, got.entries.size() == 1 && same(got.entries[0]->view.bytes, host), "bytes");
  BLOBPIPE_EXPECT(ck, !got.last.error, got.last.reason);
}

/// A host-to-device copy fails at the consumer: that blob is aborted, the
/// stream goes on, and the next blob lands intact.
void failed_landing_copy_aborts_blob(checker& ck, backend) {
  runner r;
  consumer_options copt;
  copt.landing.enabled = true;
  copt.max_chunk_bytes = 1024;
  auto ep = r.await(connect(link_kind::loopback, copt));
  std::vector<float> a(3000);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(i);
  received got;
  auto produce = [&]() -> asio::awaitable<void> {
    cuda::testing::fail_copy_after(2);
    auto first = ep.s.open_blob();
    BLOBPIPE_EXPECT(ck, !co_await first.emit("a", value::tensor(a)), "first a");
    BLOBPIPE_EXPECT(ck, !co_await first.emit("b", value::tensor(a)), "first b");
    BLOBPIPE_EXPECT(ck, !co_await first.finish(), "first finish");
    auto second = ep.s.open_blob();
    BLOBPIPE_EXPECT(ck, !co_await second.emit("a", value::tensor(a)), "second a");
    BLOBPIPE_EXPECT(ck, !co_await second.finish(), "second finish");
    BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), "shutdown");
  };
  r.spawn(produce());
  r.spawn(collect(ep.c, got));
  BLOBPIPE_EXPECT(ck, r.run(), "finished");
  BLOBPIPE_EXPECT(ck, got.ends.size() == 2, std::to_string(got.ends.size()));
  if (got.ends.size() != 2) return;
  BLOBPIPE_EXPECT(ck, got.ends[0].kind == event_kind::blob_aborted &&
                          got.ends[0].error == errc::cuda_failure,
                  got.ends[0].reason);
  BLOBPIPE_EXPECT(ck, got.ends[1].kind == event_kind::blob_complete, "second complete");
  const auto& last = got.entries.back();
  BLOBPIPE_EXPECT(ck, last->blob_id == got.ends[1].blob_id &&
                          same(to_host(last->device), std::as_bytes(std::span(a))),
                  "second lands intact");
}

/// The sender's end of a connection that, at each data frame written,
/// notes how many device-to-host copies are in flight and then lets one
/// more copy through the emulator's gate (cuda::testing::hold_copies).
class copy_pacer final : public forwarding_transport {
 public:
  copy_pacer(std::unique_ptr<transport> inner, std::vector<std::size_t>& in_flight)
      : forwarding_transport(std::move(inner)),
        frames_([&in_flight](const frame_header& h, std::uint64_t) {
          if (h.type == frame_type::data) {
            in_flight.push_back(cuda::testing::copies_in_flight());
            cuda::testing::release_copies(1);
          }
          return false;  // never stops the stream
        }) {}
  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) override {
    for (const auto& b : bytes)
      (void)frames_.feed(std::span(static_cast<const std::byte*>(b.data()), b.size()));
    return inner().write(bytes);
  }

 private:
  frame_scanner frames_;
};

/// Holds the emulator's copies from construction (letting `first` through)
/// until destruction; declare it after the runner, so the copies are let go
/// before the runner's coroutines (and their streams) are destroyed.
struct held_copies {
  explicit held_copies(std::size_t first) {
    cuda::testing::hold_copies(true);
    cuda::testing::release_copies(first);
  }
  held_copies(const held_copies&) = delete;
  held_copies& operator=(const held_copies&) = delete;
  ~held_copies() { cuda::testing::hold_copies(false); }
};

/// Closes `ep`'s consumer and waits until the sender has seen it (the
/// runner's limit bounds the wait); the sender's error.
asio::awaitable<std::error_code> close_consumer_and_wait(endpoints& ep) {
  ep.c.close();
  asio::steady_timer t(co_await asio::this_coro::executor);
  while (!ep.s.error()) {
    t.expires_after(std::chrono::milliseconds(10));
    co_await t.async_wait(asio::use_awaitable);
  }
  co_return ep.s.error();
}

/// A device entry whose copy fails after its connection failed reports
/// the connection's error, not the copy's (producer_device.cpp): the blob
/// cannot be aborted on a connection that is gone. The first copy, set to
/// fail, is held while the consumer closes; once the sender has seen that,
/// the copy is let through.
void a_device_entry_failing_after_its_connection_reports_the_connection(checker& ck, backend) {
  const auto host = pattern(40000, 5);
  auto dev = on_device(host);
  runner r;
  auto ep = r.await(connect(link_kind::loopback, {},
                            sender_opts(1024, {.pinned_chunk_bytes = 4096, .pool_depth = 2})));
  const value v = device_value(dev, u8, {40000});
  std::error_code emitted, connection;
  std::string why;
  held_copies held(0);
  cuda::testing::fail_copy_after(0);  // decided as each copy is issued
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob();
    emitted = co_await blob.emit("x", v);
    why = blob.last_error();
  };
  std::size_t copies_held = 0;
  auto break_connection = [&]() -> asio::awaitable<void> {
    copies_held = cuda::testing::copies_in_flight();  // the emit is at its first copy
    connection = co_await close_consumer_and_wait(ep);
    cuda::testing::release_copies(1000);
  };
  r.spawn(produce());
  r.spawn(break_connection());
  BLOBPIPE_EXPECT(ck, r.run(), "finished");
  BLOBPIPE_EXPECT(ck, copies_held > 0, "no copy issued before the consumer closed");
  BLOBPIPE_EXPECT(ck, connection && connection != errc::cuda_failure,
                  "the sender saw the consumer close: " + connection.message());
  BLOBPIPE_EXPECT(ck, emitted == connection,
                  "emit: " + emitted.message() + " (" + why + "), want " + connection.message());
}

/// A device value emitted once the connection has failed reports the
/// connection's error and starts nothing: no staging copy, no device entry
/// counted (its transport may already be released).
void a_device_value_after_the_connection_failed_starts_nothing(checker& ck, backend) {
  const auto host = pattern(40000, 5);
  auto dev = on_device(host);
  runner r;
  auto ep = r.await(connect(link_kind::loopback, {},
                            sender_opts(1024, {.pinned_chunk_bytes = 4096, .pool_depth = 2})));
  const value v = device_value(dev, u8, {40000});
  std::error_code emitted, connection;
  std::size_t copies_after = 0;
  auto produce = [&]() -> asio::awaitable<void> {
    connection = co_await close_consumer_and_wait(ep);
    auto blob = ep.s.open_blob();
    emitted = co_await blob.emit("x", v);
    copies_after = cuda::testing::copies_in_flight();
  };
  r.spawn(produce());
  BLOBPIPE_EXPECT(ck, r.run(), "finished");
  BLOBPIPE_EXPECT(ck, connection, "the sender saw the consumer close");
  BLOBPIPE_EXPECT(ck, emitted == connection,
                  "emit: " + emitted.message() + ", want " + connection.message());
  BLOBPIPE_EXPECT(ck, copies_after == 0, std::to_string(copies_after) + " staging copies issued");
  BLOBPIPE_EXPECT(ck, ep.s.stats().device_entries == 0,
                  std::to_string(ep.s.stats().device_entries) + " device entries started");
}

/// staging.hpp staging_ring::create: zero slot bytes or zero slots are
/// invalid_argument, not a ring with nothing to stage in.
void a_staging_ring_of_no_bytes_or_no_slots_is_invalid(checker& ck, backend) {
  BLOBPIPE_EXPECT(ck, cuda::staging_ring::create(0, 0, 2).code() == errc::invalid_argument,
                  "slot_bytes 0");
  BLOBPIPE_EXPECT(ck, cuda::staging_ring::create(0, 4096, 0).code() == errc::invalid_argument,
                  "depth 0");
  BLOBPIPE_EXPECT(ck, cuda::staging_ring::create(0, 1, 1).has_value(), "the smallest ring");
}

/// A staging ring waits for its stream before it frees its slots: a copy
/// into a slot may still be queued (staging.hpp ~staging_ring). The copy is
/// held at the emulator's gate while the ring is destroyed on a thread of
/// its own; the emulator counts pinned memory freed under a queued copy.
void a_destroyed_ring_frees_its_slots_after_their_copies(checker& ck, backend) {
  const std::size_t frees_before = cuda::testing::pinned_frees_under_copies();
  auto ring = cuda::staging_ring::create(0, 4096, 2).value();
  const auto host = pattern(4096, 3);
  // Ours must be the one copy at the gate, or release_copies(1) may let
  // another through and leave the ring's destructor waiting.
  if (cuda::testing::copies_in_flight() != 0) {
    BLOBPIPE_EXPECT(ck, false, "copies left in flight by an earlier case");
    return;
  }
  {
    held_copies held(0);
    BLOBPIPE_EXPECT(ck, ring->get_stream().copy_async(ring->slot(0), host.data(), host.size()),
                    "copy queued");
    BLOBPIPE_EXPECT(ck, cuda::testing::copies_in_flight() == 1, "one copy held");
    std::thread destroy([&] { ring.reset(); });
    // Time for a ring that does not wait to free its slots; one that waits
    // is blocked until the copy is let through.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cuda::testing::release_copies(1);
    destroy.join();
  }
  BLOBPIPE_EXPECT(ck, cuda::testing::pinned_frees_under_copies() == frees_before,
                  "a slot was freed while its copy was still queued");
  BLOBPIPE_EXPECT(ck, cuda::testing::copies_in_flight() == 0, "copies left in flight");
}

/// The overlap of copy and network, counted rather than timed: every
/// device-to-host copy waits at the emulator's gate, and one is let through
/// per data frame sent (and one to begin). While chunk k is handed to the
/// transport, the copies of chunks k+1 .. k+depth-1 must be issued and not
/// yet run: pool_depth - 1 in flight. A sender that waits for all its
/// queued copies before sending stalls at the gate (the run does not
/// finish); one whose copies run one at a time shows 0 in flight.
void staging_keeps_copies_in_flight_while_sending(checker& ck, backend) {
  const cuda::staging_options staging{.pinned_chunk_bytes = 1000, .pool_depth = 3};
  const std::size_t chunks = 10;
  const auto host = pattern(chunks * staging.pinned_chunk_bytes, 5);
  auto dev = on_device(host);
  runner r;
  std::vector<std::size_t> in_flight;  // at each data frame sent
  auto [a, b] = loopback::make_pair(r.ex());
  auto paced = std::make_unique<copy_pacer>(std::move(a), in_flight);
  held_copies held(1);
  received got;
  std::optional<sender> s;
  auto consume = [&]() -> asio::awaitable<void> {
    auto [ec, c] = co_await consumer::start(std::move(b), {});
    BLOBPIPE_EXPECT(ck, !ec, ec.message());
    if (!ec) co_await collect(c, got);
  };
  auto produce = [&]() -> asio::awaitable<void> {
    // One chunk per data frame: frames larger than a pinned chunk.
    auto [ec, ss] = co_await sender::start(std::move(paced), sender_opts(4096, staging));
    BLOBPIPE_EXPECT(ck, !ec, ec.message());
    if (ec) co_return;
    s.emplace(std::move(ss));
    auto blob = s->open_blob();
    const value v = device_value(dev, u8, {std::int64_t(host.size())});
    BLOBPIPE_EXPECT(ck, !co_await blob.emit(key_x, v), blob.last_error());
    BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
    BLOBPIPE_EXPECT(ck, !co_await s->shutdown(), "shutdown");
  };
  r.spawn(consume());
  r.spawn(produce());
  BLOBPIPE_EXPECT(ck, r.run(std::chrono::seconds(20)),
                  "finished (a serial sender stalls at the gate)");
  BLOBPIPE_EXPECT(ck, in_flight.size() == chunks,
                  std::to_string(in_flight.size()) + " data frames");
  const std::size_t depth = staging.pool_depth;
  for (std::size_t k = 0; k < in_flight.size(); ++k) {
    // Chunks with depth - 1 more behind them; then the ring drains.
    const std::size_t want = std::min(depth - 1, chunks - 1 - k);
    BLOBPIPE_EXPECT(ck, in_flight[k] == want,
                    "chunk " + std::to_string(k) + ": " + std::to_string(in_flight[k]) +
                        " copies in flight, want " + std::to_string(want));
  }
  BLOBPIPE_EXPECT(ck, s && s->stats().device_prefetch_high_water == depth - 1,
                  "device_prefetch_high_water " +
                      std::to_string(s ? s->stats().device_prefetch_high_water : 0));
  BLOBPIPE_EXPECT(ck, got.entries.size() == 1 && same(got.entries[0]->view.bytes, host), "bytes");
}

/// Work the caller queued on the legacy default stream before emit (a
/// kernel on torch's default stream, say) comes before the staging copy:
/// the staging stream is a blocking stream (cudaStreamCreate). The kernel
/// writes the value's bytes and is held until the staging stream's next
/// work is seen waiting for it; a staging copy that did not wait would
/// send the bytes from before the kernel (and the kernel would be let go
/// only once the entry had arrived).
void staging_waits_for_the_legacy_default_stream(checker& ck, backend) {
  const auto before = pattern(5000, 1), after = pattern(5000, 2);
  auto dev = on_device(before);
  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  cuda::testing::launch_on_default_stream([&] {
    std::unique_lock l(m);
    cv.wait(l, [&] { return go; });
    auto bytes = cuda::testing::kernel_view(dev.data(), after.size());
    std::memcpy(bytes.data(), after.data(), after.size());
  });
  auto release_kernel = [&] {
    {
      std::lock_guard l(m);
      go = true;
    }
    cv.notify_all();
  };
  runner r;
  auto ep = r.await(connect(link_kind::loopback, {}, sender_opts(4096)));
  received got;
  bool waited = false;
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob();
    const value v = device_value(dev, u8, {5000});
    BLOBPIPE_EXPECT(ck, !co_await blob.emit(key_x, v), blob.last_error());
    BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
    BLOBPIPE_EXPECT(ck, !co_await ep.s.shutdown(), "shutdown");
  };
  auto releaser = [&]() -> asio::awaitable<void> {
    while (got.entries.empty() && !waited) {
      co_await yield_n(1);
      waited = cuda::testing::streams_waiting_for_default_stream() > 0;
    }
    release_kernel();
  };
  r.spawn(produce());
  r.spawn(collect(ep.c, got));
  r.spawn(releaser());
  const bool finished = r.run(std::chrono::seconds(20));
  release_kernel();  // whatever happened, before the stream is waited for
  BLOBPIPE_EXPECT(ck, finished, "finished");
  BLOBPIPE_EXPECT(ck, waited, "the staging copy did not wait for the legacy default stream");
  BLOBPIPE_EXPECT(ck, got.entries.size() == 1 && same(got.entries[0]->view.bytes, after),
                  "the blob carries the kernel's output");
}

/// A transport that moves device memory itself, as UCX with cuda_copy
/// would: the device bytes go to and from the wire through the copy engine
/// (cudaMemcpy), never through the CPU, which cannot read them. Counts what
/// came through the device calls.
class device_loopback final : public forwarding_transport {
 public:
  device_loopback(std::unique_ptr<transport> inner, int& device_frames)
      : forwarding_transport(std::move(inner)), device_frames_(device_frames) {}
  bool accepts_device_memory() const noexcept override { return true; }
  bool sends_bulk() const noexcept override { return true; }
  asio::awaitable<std::error_code> write_bulk_device(std::span<const std::byte> header,
                                                     std::span<const asio::const_buffer> p,
                                                     int) override {
    ++device_frames_;
    std::vector<std::byte> bounce;
    for (const auto& b : p) {
      const std::size_t at = bounce.size();
      bounce.resize(at + b.size());
      if (auto r = cuda::copy_sync(bounce.data() + at, b.data(), b.size()); !r)
        co_return r.code();
    }
    const asio::const_buffer whole = asio::buffer(bounce);
    co_return co_await inner().write_bulk(header, std::span(&whole, 1));
  }
  asio::awaitable<std::error_code> read_exact_device(std::span<std::byte> d, int) override {
    ++device_frames_;
    std::vector<std::byte> bounce(d.size());
    if (auto ec = co_await inner().read_exact(bounce)) co_return ec;
    if (auto r = cuda::copy_sync(d.data(), bounce.data(), d.size()); !r) co_return r.code();
    co_return std::error_code{};
  }

 private:
  int& device_frames_;
};

void device_transport_gets_device_pointers(checker& ck, backend) {
  const auto host = pattern(10000, 4);
  auto dev = on_device(host);
  runner r;
  int sent_device = 0, received_device = 0;
  auto [a, b] = loopback::make_pair(r.ex());
  auto ta = std::make_unique<device_loopback>(std::move(a), sent_device);
  auto tb = std::make_unique<device_loopback>(std::move(b), received_device);
  consumer_options copt;
  copt.landing.enabled = true;
  std::optional<consumer> c;
  received got;
  auto consume = [&]() -> asio::awaitable<void> {
    auto [ec, cc] = co_await consumer::start(std::move(tb), copt);
    BLOBPIPE_EXPECT(ck, !ec, ec.message());
    if (ec) co_return;
    c.emplace(std::move(cc));
    co_await collect(*c, got);
  };
  std::optional<sender> s;
  const value v = device_value(dev, u8, {10000});
  auto produce = [&]() -> asio::awaitable<void> {
    auto [ec, ss] = co_await sender::start(std::move(ta), sender_opts(4096));
    BLOBPIPE_EXPECT(ck, !ec, ec.message());
    s.emplace(std::move(ss));
    auto blob = s->open_blob();
    BLOBPIPE_EXPECT(ck, !co_await blob.emit("x", v),
                    blob.last_error());
    BLOBPIPE_EXPECT(ck, !co_await blob.finish(), "finish");
    BLOBPIPE_EXPECT(ck, !co_await s->shutdown(), "shutdown");
  };
  r.spawn(consume());
  r.spawn(produce());
  BLOBPIPE_EXPECT(ck, r.run(), "finished");
  BLOBPIPE_EXPECT(ck, s && s->stats().device_direct_entries == 1 && s->stats().device_chunks == 0,
                  "no staging");
  // The sender hands the transport its device pointers, one data frame
  // each; the consumer lands entries through host memory and its pinned
  // ring whatever the transport (docs/cuda.md "Consumer").
  BLOBPIPE_EXPECT(ck, sent_device == 3 && received_device == 0,
                  std::to_string(sent_device) + "/" + std::to_string(received_device));
  BLOBPIPE_EXPECT(ck, got.entries.size() == 1 && same(to_host(got.entries[0]->device), host),
                  "bytes");
}

}  // namespace

std::vector<test_case> device_cases() {
  const std::vector<backend> both = {backend::real, backend::emulated};
  const std::vector<backend> emulated = {backend::emulated};
  return {
      {"device_buffer_round_trip", both, &a_device, &device_buffer_round_trip},
      {"staging_pool_reuses_rings", both, &a_device, &staging_pool_reuses_rings},
      {"describe_device_takes_only_devices_that_exist", both, &a_device,
       &describe_device_takes_only_devices_that_exist},
      {"device_values_arrive_byte_identical", both, &a_device,
       &device_values_arrive_byte_identical},
      {"device_values_arrive_through_a_resend_session", both, &a_device,
       &device_values_arrive_through_a_resend_session},
      {"automatic_device_pointer_takes_device_path", both, &a_device,
       &automatic_device_pointer_takes_device_path},
      {"strided_device_value_is_gathered", both, &a_device, &strided_device_value_is_gathered},
      {"consumer_lands_entries_in_device_memory", both, &a_device,
       &consumer_lands_entries_in_device_memory},
      {"device_to_device_from_two_producers", both, &a_device,
       &device_to_device_from_two_producers},
      {"failed_device_copy_aborts_blob", emulated, &emulator_only,
       &failed_device_copy_aborts_blob},
      {"failed_landing_copy_aborts_blob", emulated, &emulator_only,
       &failed_landing_copy_aborts_blob},
      {"device_transport_gets_device_pointers", emulated, &emulator_only,
       &device_transport_gets_device_pointers},
      {"staging_keeps_copies_in_flight_while_sending", emulated, &emulator_only,
       &staging_keeps_copies_in_flight_while_sending},
      {"staging_waits_for_the_legacy_default_stream", emulated, &emulator_only,
       &staging_waits_for_the_legacy_default_stream},
      {"a_destroyed_ring_frees_its_slots_after_their_copies", emulated, &emulator_only,
       &a_destroyed_ring_frees_its_slots_after_their_copies},
      {"a_device_value_after_the_connection_failed_starts_nothing", emulated, &emulator_only,
       &a_device_value_after_the_connection_failed_starts_nothing},
      {"a_staging_ring_of_no_bytes_or_no_slots_is_invalid", emulated, &emulator_only,
       &a_staging_ring_of_no_bytes_or_no_slots_is_invalid},
      {"a_device_entry_failing_after_its_connection_reports_the_connection", emulated,
       &emulator_only, &a_device_entry_failing_after_its_connection_reports_the_connection},
  };
}

}  // namespace blobpipe::cuda_cases
