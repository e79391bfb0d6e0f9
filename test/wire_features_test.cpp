// The optional wire features (docs/wire_features.md), sans I/O: their codecs,
// the framer's frame forms, and the push decoder accepting each form only
// when its feature was negotiated, with the violations of each.
#define BOOST_TEST_MODULE wire_features_test
#include <array>
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/protocol/framer.hpp"
#include "blobpipe/protocol/wire.hpp"

using namespace blobpipe;

namespace {

std::vector<std::byte> flatten(const outbox& out) {
  std::vector<std::byte> v;
  for (const auto& p : out.pieces()) {
    const auto b = p.bytes(out);
    v.insert(v.end(), b.begin(), b.end());
  }
  return v;
}

/// Records what a decoder reports; negotiates `accept` & the offer.
struct recorder final : decoder_listener {
  decoder* dec = nullptr;
  std::uint64_t accept = 0;
  std::vector<std::string> log;
  std::vector<blob_group> groups;
  std::vector<std::optional<std::uint64_t>> stamps;
  std::vector<std::uint64_t> requests;
  std::vector<std::vector<std::byte>> entries;
  std::uint64_t held = 0;  // credit of entries not released

  result<void> on_hello(const hello& h) override {
    auto l = dec->limits();
    l.features = h.features & accept;
    dec->set_limits(l);
    return {};
  }
  result<void*> on_blob_begin(std::uint64_t id, const tag_t&) override {
    log.push_back("begin " + std::to_string(id));
    return static_cast<void*>(nullptr);
  }
  result<void> on_blob_group(void*, std::uint64_t id, const blob_group& g) override {
    log.push_back("group " + std::to_string(id));
    groups.push_back(g);
    return {};
  }
  result<std::span<std::byte>> on_entry_begin(void*, const entry_announcement& a) override {
    stamps.push_back(a.sent_ns);
    held += a.credit;
    entries.emplace_back(a.entry->len);
    return std::span<std::byte>(entries.back());
  }
  result<void> on_blob_complete(void*, std::uint64_t id, blob_index,
                                std::span<const std::byte>) override {
    log.push_back("complete " + std::to_string(id));
    return {};
  }
  result<void> on_credit_request(std::uint64_t credit) override {
    requests.push_back(credit);
    return {};
  }
  result<void> on_ack(std::uint64_t credit, std::uint64_t) override {
    log.push_back("ack " + std::to_string(credit));
    return {};
  }
};

/// A sender's stream decoded by a consumer's decoder that accepts `accept`.
struct consumer_side {
  recorder l;
  decoder d;
  explicit consumer_side(std::uint64_t accept, std::uint64_t window = 1 << 20)
      : d(wire_role::sender, {.window_bytes = window}, l) {
    l.dec = &d;
    l.accept = accept;
  }
  result<void> feed(const outbox& out) { return d.consume(flatten(out)); }
};

/// A hello offering `features`.
outbox hello_offering(std::uint64_t features) {
  outbox out;
  frame_hello(out, hello{.role = wire_role::sender, .features = features});
  return out;
}

tag_t tag_of(std::uint8_t b) {
  tag_t t{};
  t.fill(std::byte{b});
  return t;
}

/// One planned entry (and its builder, for the tail).
struct one_entry {
  std::vector<float> x;
  layout_builder lb;
  const planned_entry* pe = nullptr;
  std::vector<std::byte> meta;
  explicit one_entry(std::size_t n) : x(n, 1.5f) {
    pe = *lb.add("x", value::tensor(x));
    meta = pe->entry.meta();
  }
  std::span<const std::byte> bytes() const { return std::as_bytes(std::span(x.data(), x.size())); }
  std::vector<std::byte> tail(const tag_t& t) {
    auto p = lb.finish(t);
    std::vector<std::byte> out(tail_size(*p));
    (void)write_tail(*p, out);
    return out;
  }
};

constexpr std::uint64_t all = known_features;

}  // namespace

BOOST_AUTO_TEST_CASE(feature_bits_and_flags_are_the_reserved_ones) {
  BOOST_TEST(feature_entry_timestamps == 1u);
  BOOST_TEST(feature_blob_groups == 2u);
  BOOST_TEST(feature_credit_grants == 4u);
  BOOST_TEST(feature_compact_entries == 16u);  // bit 3 stays reserved (UCX rendezvous)
  BOOST_TEST(known_features == 0x17u);
  std::array<std::byte, frame_header_size> buf;
  const auto flags_ok = [&](frame_type t, std::uint8_t f) {
    encode_frame_header({.type = t, .flags = f}, buf);
    return decode_frame_header(buf, 1024).has_value();
  };
  BOOST_TEST(flags_ok(frame_type::blob_begin, frame_flag_group));
  BOOST_TEST(!flags_ok(frame_type::blob_begin, 0x02));
  BOOST_TEST(flags_ok(frame_type::entry_begin, frame_flag_inline | frame_flag_timestamp));
  BOOST_TEST(flags_ok(frame_type::entry_begin, frame_flag_compact));
  BOOST_TEST(frame_flag_compact == 0x08);
  BOOST_TEST(!flags_ok(frame_type::entry_begin, 0x02));
  BOOST_TEST(!flags_ok(frame_type::entry_begin, 0x10));
  BOOST_TEST(flags_ok(frame_type::ack, frame_flag_credit_request));
  BOOST_TEST(!flags_ok(frame_type::ack, 0x01));
  BOOST_TEST(!flags_ok(frame_type::data, frame_flag_group));
  BOOST_TEST(!flags_ok(frame_type::tail, frame_flag_timestamp));
}

BOOST_AUTO_TEST_CASE(blob_group_round_trips_and_rejects_size_zero_and_reserved) {
  std::array<std::byte, blob_group_bytes> b{};
  encode_blob_group({.id = 0x0102030405060708ull, .size = 16}, b);
  BOOST_TEST(std::to_integer<int>(b[0]) == 8);   // little-endian id
  BOOST_TEST(std::to_integer<int>(b[8]) == 16);  // size at 8
  auto g = decode_blob_group(b);
  BOOST_TEST_REQUIRE(g.has_value());
  BOOST_TEST(g->id == 0x0102030405060708ull);
  BOOST_TEST(g->size == 16u);
  auto zero = b;
  zero[8] = std::byte{0};
  BOOST_TEST((decode_blob_group(zero).code() == errc::protocol_violation));
  auto reserved = b;
  reserved[15] = std::byte{1};
  BOOST_TEST((decode_blob_group(reserved).code() == errc::protocol_violation));
  BOOST_TEST((decode_blob_group(std::span(b).first(15)).code() == errc::protocol_violation));
}

BOOST_AUTO_TEST_CASE(framer_writes_a_grouped_blob_begin_and_a_stamped_entry_begin) {
  outbox out;
  frame_blob_begin(out, 7, tag_of(0xAA), blob_group{.id = 42, .size = 3});
  auto bytes = flatten(out);
  auto h = decode_frame_header(bytes, 1024);
  BOOST_TEST_REQUIRE(h.has_value());
  BOOST_TEST(h->flags == frame_flag_group);
  BOOST_TEST(h->length == TAG_SIZE + blob_group_bytes);
  BOOST_TEST(std::to_integer<int>(bytes[frame_header_size]) == 0xAA);
  auto g = decode_blob_group(std::span(bytes).subspan(frame_header_size + TAG_SIZE));
  BOOST_TEST_REQUIRE(g.has_value());
  BOOST_TEST((*g == blob_group{.id = 42, .size = 3}));

  one_entry e(4);
  out.clear();
  auto room = frame_entry_begin_inline(out, 7, 0, e.pe->entry, e.meta, 123456789ull);
  BOOST_TEST(room.size() == e.pe->entry.len);
  bytes = flatten(out);
  h = decode_frame_header(bytes, 1024);
  BOOST_TEST_REQUIRE(h.has_value());
  BOOST_TEST(h->flags == (frame_flag_inline | frame_flag_timestamp));
  BOOST_TEST(h->length == timestamp_bytes + 8 + 1 + e.meta.size() + e.pe->entry.len);
  BOOST_TEST(decode_timestamp(std::span(bytes).subspan(frame_header_size)) == 123456789ull);
  out.clear();
  frame_entry_begin(out, 7, 0, e.pe->entry, e.meta);  // no stamp: the v3 form, unchanged
  h = decode_frame_header(flatten(out), 1024);
  BOOST_TEST(h->flags == 0);
  BOOST_TEST(h->length == 8 + 1 + e.meta.size());
}

BOOST_AUTO_TEST_CASE(decoder_reports_a_group_after_its_blob_begin) {
  consumer_side c(all);
  auto out = hello_offering(feature_blob_groups);
  frame_blob_begin(out, 1, tag_of(1), blob_group{.id = 9, .size = 2});
  frame_blob_begin(out, 2, tag_of(2));  // ungrouped blobs stay as they were
  BOOST_TEST_REQUIRE(c.feed(out).has_value());
  BOOST_TEST(c.l.log == (std::vector<std::string>{"begin 1", "group 1", "begin 2"}));
  BOOST_TEST_REQUIRE(c.l.groups.size() == 1u);
  BOOST_TEST((c.l.groups[0] == blob_group{.id = 9, .size = 2}));
}

BOOST_AUTO_TEST_CASE(decoder_refuses_a_group_not_negotiated_or_malformed) {
  {  // offered, not accepted
    consumer_side c(0);
    auto out = hello_offering(feature_blob_groups);
    frame_blob_begin(out, 1, tag_of(1), blob_group{.id = 9, .size = 2});
    BOOST_TEST((c.feed(out).code() == errc::protocol_violation));
    BOOST_TEST(c.l.log.empty());
  }
  {  // accepted, size 0
    consumer_side c(all);
    auto out = hello_offering(all);
    frame_blob_begin(out, 1, tag_of(1), blob_group{.id = 9, .size = 0});
    BOOST_TEST((c.feed(out).code() == errc::protocol_violation));
    BOOST_TEST(c.l.log.empty());  // refused before the blob began
  }
  {  // the flag on a 16-byte payload
    consumer_side c(all);
    auto out = hello_offering(all);
    out.clear();
    BOOST_TEST_REQUIRE(c.feed(hello_offering(all)).has_value());
    frame_blob_begin(out, 1, tag_of(1));
    auto bytes = flatten(out);
    bytes[1] = std::byte{frame_flag_group};
    BOOST_TEST((c.d.consume(bytes).code() == errc::protocol_violation));
  }
}

BOOST_AUTO_TEST_CASE(decoder_hands_on_the_timestamp_of_inline_and_chunked_entries) {
  consumer_side c(all);
  auto out = hello_offering(feature_entry_timestamps);
  frame_blob_begin(out, 1, tag_of(1));
  one_entry small(4);
  auto room = frame_entry_begin_inline(out, 1, 0, small.pe->entry, small.meta, 1111ull);
  std::memcpy(room.data(), small.bytes().data(), room.size());
  BOOST_TEST_REQUIRE(c.feed(out).has_value());
  one_entry big(1000);
  outbox out2;
  frame_blob_begin(out2, 2, tag_of(2));
  frame_entry_begin(out2, 2, 0, big.pe->entry, big.meta, 2222ull);
  frame_data(out2, 2, 0, big.bytes(), 1024, /*copy=*/true);
  const auto tail = big.tail(tag_of(2));
  frame_tail(out2, 2, tail);
  BOOST_TEST_REQUIRE(c.feed(out2).has_value());
  BOOST_TEST_REQUIRE(c.l.stamps.size() == 2u);
  BOOST_TEST((c.l.stamps[0] == std::optional<std::uint64_t>(1111)));
  BOOST_TEST((c.l.stamps[1] == std::optional<std::uint64_t>(2222)));
  BOOST_TEST((c.l.entries[1] == std::vector<std::byte>(big.bytes().begin(), big.bytes().end())));
  BOOST_TEST(c.l.log.back() == "complete 2");
}

BOOST_AUTO_TEST_CASE(decoder_refuses_a_timestamp_not_negotiated_or_cut_short) {
  one_entry e(4);
  {
    consumer_side c(all);
    auto out = hello_offering(0);  // not offered: not negotiated
    frame_blob_begin(out, 1, tag_of(1));
    frame_entry_begin(out, 1, 0, e.pe->entry, e.meta, 5ull);
    BOOST_TEST((c.feed(out).code() == errc::protocol_violation));
    BOOST_TEST(c.l.stamps.empty());
  }
  {  // the flag set on an entry_begin without the 8 bytes
    consumer_side c(all);
    BOOST_TEST_REQUIRE(c.feed(hello_offering(all)).has_value());
    outbox out;
    frame_blob_begin(out, 1, tag_of(1));
    BOOST_TEST_REQUIRE(c.feed(out).has_value());
    out.clear();
    const auto payload =
        encode_entry_begin("", std::vector<std::byte>{std::byte{0x80}});  // 9 bytes
    std::array<std::byte, frame_header_size> head;
    encode_frame_header({.type = frame_type::entry_begin,
                         .flags = frame_flag_timestamp,
                         .length = static_cast<std::uint32_t>(payload.size()),
                         .blob_id = 1},
                        head);
    std::vector<std::byte> bytes(head.begin(), head.end());
    bytes.insert(bytes.end(), payload.begin(), payload.end());
    BOOST_TEST((c.d.consume(bytes).code() == errc::protocol_violation));
  }
}

BOOST_AUTO_TEST_CASE(decoder_takes_credit_requests_only_with_credit_grants) {
  {
    consumer_side c(all);
    auto out = hello_offering(feature_credit_grants);
    frame_credit_request(out, 4096);
    frame_credit_request(out, 8192);
    BOOST_TEST_REQUIRE(c.feed(out).has_value());
    BOOST_TEST(c.l.requests == (std::vector<std::uint64_t>{4096, 8192}));
  }
  {
    consumer_side c(feature_blob_groups);
    auto out = hello_offering(feature_credit_grants);  // offered, not accepted
    frame_credit_request(out, 4096);
    BOOST_TEST((c.feed(out).code() == errc::protocol_violation));
  }
  {  // a plain ack from a sender is still unexpected
    consumer_side c(all);
    auto out = hello_offering(all);
    frame_ack(out, 10, 0);
    BOOST_TEST((c.feed(out).code() == errc::protocol_violation));
  }
  {  // a credit request naming a blob
    consumer_side c(all);
    BOOST_TEST_REQUIRE(c.feed(hello_offering(all)).has_value());
    std::array<std::byte, frame_header_size> head;
    encode_frame_header(
        {.type = frame_type::ack, .flags = frame_flag_credit_request, .blob_id = 3, .arg = 1},
        head);
    BOOST_TEST((c.d.consume(head).code() == errc::protocol_violation));
  }
  {  // a consumer's ack with the request flag, read by a sender
    recorder l;
    decoder d(wire_role::consumer, {}, l);
    l.dec = &d;
    l.accept = all;
    outbox out;
    frame_hello(out, hello{.role = wire_role::consumer, .window_bytes = 1, .features = all});
    frame_credit_request(out, 1);
    BOOST_TEST((d.consume(flatten(out)).code() == errc::protocol_violation));
    BOOST_TEST(l.log.empty());
  }
}

BOOST_AUTO_TEST_CASE(with_credit_grants_nothing_is_admitted_beyond_the_credit_granted) {
  one_entry e(1000);  // credit: 4000 + key + meta + 256
  const std::uint64_t credit = entry_credit(e.pe->entry.len, 1, e.meta.size());
  const auto stream = [&](std::uint64_t blob) {
    outbox out;
    frame_blob_begin(out, blob, tag_of(static_cast<std::uint8_t>(blob)));
    frame_entry_begin(out, blob, 0, e.pe->entry, e.meta);
    frame_data(out, blob, 0, e.bytes(), 1 << 20, true);
    return out;
  };
  {  // plain credit: an entry larger than the window goes alone
    consumer_side c(all, credit - 1);
    BOOST_TEST_REQUIRE(c.feed(hello_offering(0)).has_value());
    BOOST_TEST(c.feed(stream(1)).has_value());
  }
  {  // credit grants: not without its credit, however empty the window
    consumer_side c(all, credit - 1);
    BOOST_TEST_REQUIRE(c.feed(hello_offering(feature_credit_grants)).has_value());
    BOOST_TEST((c.feed(stream(1)).code() == errc::protocol_violation));
  }
  {  // granted once, used, released: the credit is the pool's again
    consumer_side c(all, 0);
    BOOST_TEST_REQUIRE(c.feed(hello_offering(feature_credit_grants)).has_value());
    c.d.grant(credit);
    BOOST_TEST(c.d.limits().window_bytes == credit);
    BOOST_TEST_REQUIRE(c.feed(stream(1)).has_value());
    BOOST_TEST(c.d.buffered_bytes() == credit);
    c.d.release(credit);
    BOOST_TEST(c.d.buffered_bytes() == 0u);
    BOOST_TEST(c.d.limits().window_bytes == 0u);
    BOOST_TEST((c.feed(stream(2)).code() == errc::protocol_violation));
  }
}

BOOST_AUTO_TEST_CASE(grants_summing_past_2_to_the_64_saturate_the_window) {
  consumer_side c(all, 0);
  BOOST_TEST_REQUIRE(c.feed(hello_offering(feature_credit_grants)).has_value());
  c.d.grant(~std::uint64_t{0} - 10);
  c.d.grant(100);  // would wrap to 89
  BOOST_TEST(c.d.limits().window_bytes == ~std::uint64_t{0});
}
