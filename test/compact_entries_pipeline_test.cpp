// Compact entries (feature_compact_entries, docs/wire.md "Compact
// entries") end to end: a sender and a consumer negotiate the feature by
// default and the assembled blob is byte-identical to the reference's
// write(plan); a consumer that leaves the bit out gets msgpack frames
// only, and the same blob. The frames are counted on the sender's
// transport as they are written.
//
// Coroutine lambdas are named locals of the (non-coroutine) test body.
#define BOOST_TEST_MODULE compact_entries_pipeline
#include <boost/test/unit_test.hpp>

#include <cstring>

#include "test/forwarding_transport.hpp"
#include "test/frame_scanner.hpp"
#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

/// entry_begin frames the sender wrote, by form.
struct frame_counts {
  int compact = 0;
  int msgpack = 0;
};

/// The sender's transport, counting the entry_begin frames it writes.
class counting_transport final : public forwarding_transport {
 public:
  counting_transport(std::unique_ptr<transport> inner, frame_counts& counts)
      : forwarding_transport(std::move(inner)),
        scan_([&counts](const frame_header& h, std::uint64_t) {
          if (h.type == frame_type::entry_begin)
            ++((h.flags & frame_flag_compact) ? counts.compact : counts.msgpack);
          return false;
        }) {}
  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer> bytes) override {
    for (const auto& b : bytes) (void)scan_.feed({static_cast<const std::byte*>(b.data()), b.size()});
    return forwarding_transport::write(bytes);
  }
  asio::awaitable<std::error_code> write_bulk(std::span<const std::byte> header,
                                              std::span<const asio::const_buffer> payload) override {
    (void)scan_.feed(header);
    for (const auto& b : payload) (void)scan_.feed({static_cast<const std::byte*>(b.data()), b.size()});
    return forwarding_transport::write_bulk(header, payload);
  }
  payload_receipt post_write_bulk(std::span<const std::byte> header,
                                  std::span<const asio::const_buffer> payload) override {
    (void)scan_.feed(header);
    for (const auto& b : payload) (void)scan_.feed({static_cast<const std::byte*>(b.data()), b.size()});
    return forwarding_transport::post_write_bulk(header, payload);
  }

 private:
  frame_scanner scan_;
};

/// A started sender (its writes counted) and consumer over `l`.
asio::awaitable<endpoints> connect_counted(link_kind l, consumer_options copt,
                                           frame_counts& counts) {
  sender_options sopt;
  sopt.chunk_bytes = 256;
  co_return co_await connect(l, std::move(copt), sopt, [&counts](std::unique_ptr<transport> t) {
    return std::unique_ptr<transport>(std::make_unique<counting_transport>(std::move(t), counts));
  });
}

/// The values sent: coded dtypes (inline and in data frames, a pickle, a
/// 0-d tensor, 5 dims) and one without a code (|V4, msgpack form).
struct sample {
  std::vector<float> f = ramp(1000, 1.0f);  // 4000 bytes: data frames of 256
  std::vector<float> small = ramp(6, 2.0f);
  std::vector<std::int16_t> five = std::vector<std::int16_t>(16, 3);
  std::vector<std::byte> pick = std::vector<std::byte>(9, std::byte{0x80});
  std::vector<std::byte> rec = std::vector<std::byte>(8, std::byte{0x5a});
  float one = 4.5f;
  static constexpr int entries = 6;

  std::vector<std::pair<std::string, value>> values() const {
    std::vector<std::pair<std::string, value>> v;
    v.emplace_back("f", value::tensor(f));
    v.emplace_back("small", value::tensor(small, shape_t{2, 3}));
    v.emplace_back("five", value::ndarray_bytes(std::as_bytes(std::span(five)), "<i2",
                                                shape_t{2, 1, 2, 2, 2}));
    v.emplace_back("p", value::pickle(pick));
    v.emplace_back("one", value::scalar(one));
    v.emplace_back("rec", value::ndarray_bytes(rec, "|V4", shape_t{2}));
    return v;
  }
  /// The reference's bytes for these values under `tag`.
  std::vector<std::byte> reference(const tag_t& tag) const {
    layout_builder lb;
    for (auto& [k, v] : values()) (void)*lb.add(k, v);
    auto plan = lb.finish(tag);
    std::vector<std::byte> out(plan->nbytes);
    BOOST_TEST_REQUIRE(write(*plan, out).has_value());
    return out;
  }
};

/// Sends the sample as one blob to a consumer with `copt`; returns the
/// assembled blob.
std::vector<std::byte> send_sample(const sample& x, consumer_options copt, frame_counts& counts,
                                   std::uint64_t& features, const tag_t& tag) {
  runner r;
  copt.assemble = assemble_mode::memory;
  auto ep = r.await(connect_counted(link_kind::tcp, std::move(copt), counts));
  features = ep.c.features();
  std::vector<std::byte> got;
  auto produce = [&]() -> asio::awaitable<void> {
    auto blob = ep.s.open_blob(tag);
    for (auto& [k, v] : x.values()) {
      std::string key = k;
      value val = v;
      BLOBPIPE_CO_CHECK(blob.emit(std::move(key), std::move(val)));
    }
    BLOBPIPE_CO_CHECK(blob.finish());
    BLOBPIPE_CO_CHECK(ep.s.shutdown());
  };
  auto consume = [&]() -> asio::awaitable<void> {
    for (;;) {
      auto ev = co_await ep.c.next();
      if (ev.kind == event_kind::blob_complete) {
        got.assign(ev.blob->bytes.begin(), ev.blob->bytes.end());
      } else if (ev.kind == event_kind::end_of_stream) {
        BOOST_TEST(!ev.error, ev.error.message() << ": " << ev.reason);
        break;
      }
    }
  };
  r.spawn(produce());
  r.spawn(consume());
  BOOST_TEST_REQUIRE(r.run());
  return got;
}

tag_t tag_of(std::uint8_t b) {
  tag_t t{};
  t.fill(std::byte{b});
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_blob_sent_compact_assembles_byte_identical_to_the_reference) {
  const sample x;
  frame_counts counts;
  std::uint64_t features = 0;
  const auto got = send_sample(x, {}, counts, features, tag_of(7));
  BOOST_TEST((features & feature_compact_entries) != 0);  // accepted by default
  BOOST_TEST(counts.compact == sample::entries - 1);       // all but |V4
  BOOST_TEST(counts.msgpack == 1);
  const auto want = x.reference(tag_of(7));
  BOOST_TEST((got == want), "assembled " << got.size() << " bytes, reference " << want.size());
}

BOOST_AUTO_TEST_CASE(a_consumer_without_the_bit_gets_msgpack_frames_and_the_same_blob) {
  const sample x;
  frame_counts counts;
  std::uint64_t features = 0;
  consumer_options copt;
  copt.accept_features = feature_blob_groups;  // leaves compact entries out
  const auto got = send_sample(x, std::move(copt), counts, features, tag_of(8));
  BOOST_TEST((features & feature_compact_entries) == 0);
  BOOST_TEST(counts.compact == 0);
  BOOST_TEST(counts.msgpack == sample::entries);
  BOOST_TEST((got == x.reference(tag_of(8))));
}
