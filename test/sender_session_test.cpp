// The sans-IO sender (blobpipe/protocol/sender_session.hpp), driven with
// calls and no socket, as the decoder's tests drive the decoder: what it
// frames is fed to a push decoder playing the consumer, which must report
// the blobs as sent, and is compared byte for byte with the framer calls a
// sender makes (the wire bytes must not change). Each refusal asserts its
// code and the field or limit its message names; credit arithmetic,
// resending after a reconnect (each blob delivered once) and the counters
// are checked call by call.
#define BOOST_TEST_MODULE sender_session_test
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <functional>
#include <random>
#include <limits>
#include <map>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include "blobpipe/format/layout.hpp"
#include "blobpipe/protocol/decoder.hpp"
#include "blobpipe/protocol/sender_session.hpp"

using namespace blobpipe;

namespace blobpipe {
// For Boost.Test's messages: a result prints as "ok" or its error.
template <class T>
std::ostream& operator<<(std::ostream& o, const result<T>& r) {
  return o << (r ? std::string("ok") : r.message());
}
}  // namespace blobpipe

namespace {

constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();

tag_t tag_of(char c) {
  tag_t t{};
  t.fill(static_cast<std::byte>(c));
  return t;
}

std::vector<std::byte> flat(const outbox& o) {
  std::vector<std::byte> v;
  for (const auto& p : o.pieces()) {
    auto b = p.bytes(o);
    v.insert(v.end(), b.begin(), b.end());
  }
  return v;
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>(seed * 31 + i * 7 + (i >> 8));
  return v;
}

value bytes_value(const std::vector<std::byte>& v) {
  return value::ndarray_bytes(v, "|u1", {static_cast<std::int64_t>(v.size())});
}

sender_limits small_limits(std::uint64_t features = 0) {
  return sender_limits{.chunk_bytes = 64, .inline_bytes = 100, .window_bytes = 1 << 20,
                       .features = features, .max_key_bytes = 64, .max_meta_bytes = 200,
                       .dedup_window = 8};
}

/// The consumer: records events as lines and lands entries.
class recorder final : public decoder_listener {
 public:
  std::vector<std::string> lines;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::byte>> landed;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::uint64_t> stamps;
  std::map<std::uint64_t, std::uint64_t> entry_of;  // blob id -> index being received

  result<void> on_hello(const hello&) override { return {}; }
  result<void*> on_blob_begin(std::uint64_t id, const tag_t& tag) override {
    lines.push_back("begin " + std::to_string(id) + " " + static_cast<char>(tag[0]));
    return nullptr;
  }
  result<std::span<std::byte>> on_entry_begin(void*, const entry_announcement& a) override {
    lines.push_back("entry " + std::to_string(a.blob_id) + "/" + std::to_string(a.index) + " " +
                    a.entry->key);
    if (a.sent_ns) stamps[{a.blob_id, a.index}] = *a.sent_ns;
    entry_of[a.blob_id] = a.index;
    auto& buf = landed[{a.blob_id, a.index}];
    buf.assign(a.entry->len, std::byte{0xEE});
    return std::span<std::byte>(buf);
  }
  result<void> on_blob_complete(void*, std::uint64_t id, blob_index, std::span<const std::byte>) override {
    lines.push_back("complete " + std::to_string(id));
    return {};
  }
  result<void> on_blob_abort(void*, std::uint64_t id, std::string_view reason) override {
    lines.push_back("abort " + std::to_string(id) + " " + std::string(reason));
    return {};
  }
  result<void> on_blob_group(void*, std::uint64_t id, const blob_group& g) override {
    lines.push_back("group " + std::to_string(id) + " size " + std::to_string(g.size));
    return {};
  }
};

/// Feeds what the session framed (after a sender hello) to a decoder.
struct consumer {
  explicit consumer(const sender_limits& l) {
    decoder_limits dl;
    dl.max_chunk_bytes = l.chunk_bytes;
    dl.inline_bytes = l.inline_bytes;
    dl.window_bytes = 1ull << 40;
    dl.features = l.features;
    dec = std::make_unique<decoder>(wire_role::sender, dl, rec);
    outbox h;
    frame_hello(h, hello{.role = wire_role::sender});
    BOOST_REQUIRE(dec->consume(flat(h)));
  }
  result<void> feed(outbox& o) {
    auto r = dec->consume(flat(o));
    o.clear();
    return r;
  }
  recorder rec;
  std::unique_ptr<decoder> dec;
};

/// One blob's planning, as blob_writer does it.
struct planner {
  layout_builder builder;
  std::vector<std::vector<std::byte>> values;  // kept alive: chunks point at them
  std::vector<std::byte> meta;

  const planned_entry& add(std::string key, std::vector<std::byte> bytes) {
    values.push_back(std::move(bytes));
    auto r = builder.add(std::move(key), bytes_value(values.back()));
    BOOST_REQUIRE(r);
    meta = (*r)->entry.meta();
    return **r;
  }
  std::vector<std::byte> tail(const tag_t& tag) {
    auto plan = builder.finish(tag).value();
    std::vector<std::byte> t(tail_size(plan));
    BOOST_REQUIRE(write_tail(plan, t));
    return t;
  }
};

/// The whole step sequence for one entry, as the producer's loop runs it
/// (credit must fit).
void send_entry(sender_session& s, sender_blob& b, planner& p, std::string key,
                std::vector<std::byte> bytes, std::uint64_t ns = 7,
                entry_route route = entry_route::automatic) {
  BOOST_REQUIRE(s.check_emit(b, key.size()));
  const planned_entry& pe = p.add(std::move(key), std::move(bytes));
  auto credit = s.plan_entry(b, pe.entry, p.meta);
  BOOST_REQUIRE(credit);
  BOOST_TEST(*credit == entry_credit(pe.entry.len, pe.entry.key.size(), p.meta.size()));
  BOOST_REQUIRE(s.take_credit(*credit));
  auto room = s.add_entry(b, pe.entry, p.meta, ns, route);
  const std::span<const std::byte> src(pe.source.data, pe.entry.len);
  if (!room.empty()) {
    std::memcpy(room.data(), src.data(), src.size());
  } else {
    for (std::size_t at = 0; at < src.size();) {
      const std::size_t n = s.add_chunk(b, src.subspan(at));
      BOOST_REQUIRE(n > 0u);
      at += n;
    }
  }
  BOOST_TEST(s.entry_sent(b));
  BOOST_TEST(!b.broken());
}

void finish_blob(sender_session& s, sender_blob& b, planner& p) {
  BOOST_REQUIRE(s.check_finish(b));
  auto tail = p.tail(b.tag());
  BOOST_REQUIRE(s.take_credit(tail.size()));
  BOOST_REQUIRE(s.finish(b, tail));
}

}  // namespace

// ---- whole sequences ----------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_blob_sent_call_by_call_decodes_as_sent_and_matches_the_framer_bytes) {
  sender_session s;
  const auto lim = small_limits();
  s.connect(lim);
  consumer c(lim);
  sender_blob b(tag_of('a'));
  planner p;
  const auto small = pattern(40, 1), big = pattern(300, 2);
  send_entry(s, b, p, "small", small);   // inline
  send_entry(s, b, p, "big", big);       // 5 data frames of <= 64 bytes
  send_entry(s, b, p, "empty", {});      // entry_begin alone
  finish_blob(s, b, p);
  const auto wire = flat(s.out());

  // The frames the sender made before the session (framer calls by hand).
  outbox ref;
  std::size_t tail_bytes = 0;
  planner q;  // outlives `ref`, whose data frames point at its values
  frame_blob_begin(ref, 1, tag_of('a'));
  {
    const auto& e0 = q.add("small", small);
    auto room = frame_entry_begin_inline(ref, 1, 0, e0.entry, q.meta);
    std::memcpy(room.data(), small.data(), small.size());
    const auto& e1 = q.add("big", big);
    frame_entry_begin(ref, 1, 1, e1.entry, q.meta);
    frame_data(ref, 1, e1.entry.off, std::span(q.values.back()), 64, false);
    const auto& e2 = q.add("empty", {});
    frame_entry_begin(ref, 1, 2, e2.entry, q.meta);
    const auto t = q.tail(tag_of('a'));
    frame_tail(ref, 1, t);
    tail_bytes = t.size();
  }
  BOOST_TEST(wire == flat(ref));

  BOOST_REQUIRE(c.feed(s.out()));
  const std::vector<std::string> want = {"begin 1 a", "entry 1/0 small", "entry 1/1 big",
                                         "entry 1/2 empty", "complete 1"};
  BOOST_TEST(c.rec.lines == want, boost::test_tools::per_element());
  BOOST_TEST((c.rec.landed[{1, 0}] == small));
  BOOST_TEST((c.rec.landed[{1, 1}] == big));
  BOOST_TEST((c.rec.landed[{1, 2}].empty()));

  const auto& n = s.counts();
  BOOST_TEST(n.entries_sent == 3u);
  BOOST_TEST(n.data_frames_sent == 5u);
  BOOST_TEST(n.bytes_sent == 340u + tail_bytes);  // entries and the tail
  BOOST_TEST(n.blobs_sent == 1u);
  BOOST_TEST(n.first_entry_ns == 7u);
  BOOST_TEST(b.ended());
  BOOST_TEST(b.entries() == 3u);
}

BOOST_AUTO_TEST_CASE(blob_ids_rise_in_the_order_blobs_begin_not_the_order_they_were_opened) {
  sender_session s;
  const auto lim = small_limits();
  s.connect(lim);
  consumer c(lim);
  sender_blob first(tag_of('f')), second(tag_of('s'));
  planner pf, ps;
  send_entry(s, second, ps, "x", pattern(8, 3));
  send_entry(s, first, pf, "y", pattern(8, 4));
  send_entry(s, second, ps, "z", pattern(8, 5));
  finish_blob(s, first, pf);
  finish_blob(s, second, ps);
  BOOST_TEST(second.id() == 1u);
  BOOST_TEST(first.id() == 2u);
  BOOST_REQUIRE(c.feed(s.out()));
  const std::vector<std::string> want = {"begin 1 s", "entry 1/0 x", "begin 2 f", "entry 2/0 y",
                                         "entry 1/1 z", "complete 2", "complete 1"};
  BOOST_TEST(c.rec.lines == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(an_abort_is_framed_only_for_a_blob_the_consumer_heard_of) {
  sender_session s;
  const auto lim = small_limits();
  s.connect(lim);
  consumer c(lim);
  sender_blob quiet(tag_of('q')), loud(tag_of('l'));
  planner p;
  BOOST_TEST(!s.abort(quiet, "never begun"));
  BOOST_TEST(quiet.ended());
  BOOST_TEST(s.out().empty());
  send_entry(s, loud, p, "x", pattern(8, 1));
  BOOST_TEST(s.abort(loud, "stop"));
  BOOST_TEST(!s.abort(loud, "twice"));  // ended: no second abort
  BOOST_TEST(s.counts().blobs_aborted == 1u);
  BOOST_REQUIRE(c.feed(s.out()));
  const std::vector<std::string> want = {"begin 1 l", "entry 1/0 x", "abort 1 stop"};
  BOOST_TEST(c.rec.lines == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(an_abort_mid_entry_is_framed_and_the_consumer_drops_the_blob) {
  sender_session s;
  const auto lim = small_limits();
  s.connect(lim);
  consumer c(lim);
  sender_blob b(tag_of('m'));
  planner p;
  const auto& pe = p.add("big", pattern(300, 9));
  // (Without plan_entry, as a resend session frames a kept entry: the
  // blob is not marked broken, and finish() must still refuse.)
  BOOST_REQUIRE(s.take_credit(entry_credit(300, 3, p.meta.size())));
  BOOST_TEST(s.add_entry(b, pe.entry, p.meta, 1, entry_route::automatic).empty());
  BOOST_TEST(s.add_chunk(b, std::span(pe.source.data, 300)) == 64u);
  BOOST_TEST(!s.entry_sent(b));  // 236 bytes still to frame
  BOOST_TEST(!b.broken());
  BOOST_TEST((s.finish(b, {}).code() == errc::closed));  // an entry is open
  BOOST_TEST(s.abort(b, "cuda: copy failed"));
  BOOST_TEST(s.add_chunk(b, std::span(pe.source.data, 300)) == 0u);  // nothing more of it
  BOOST_REQUIRE(c.feed(s.out()));
  BOOST_TEST(c.rec.lines.back() == "abort 1 cuda: copy failed");
}

BOOST_AUTO_TEST_CASE(entries_are_stamped_when_the_consumer_accepted_timestamps_chunked_ones_too) {
  for (bool stamped : {false, true}) {
    BOOST_TEST_CONTEXT("timestamps accepted: " << stamped) {
      sender_session s;
      const auto lim = small_limits(stamped ? feature_entry_timestamps : 0);
      s.connect(lim);
      consumer c(lim);
      sender_blob b(tag_of('t'));
      planner p;
      send_entry(s, b, p, "host", pattern(16, 1), 1111);
      // Bytes the caller cannot copy at once (device memory): chunks, stamped alike.
      send_entry(s, b, p, "device", pattern(16, 2), 2222, entry_route::chunks);
      BOOST_TEST(s.counts().data_frames_sent == 1u);  // not inline, though it would fit
      BOOST_REQUIRE(c.feed(s.out()));
      BOOST_TEST((c.rec.landed[{1, 1}] == pattern(16, 2)));
      if (stamped) {
        BOOST_TEST(c.rec.stamps.size() == 2u);
        BOOST_TEST((c.rec.stamps[{1, 0}] == 1111u));
        BOOST_TEST((c.rec.stamps[{1, 1}] == 2222u));
      } else {
        BOOST_TEST(c.rec.stamps.empty());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_group_goes_in_blob_begin_only_where_the_consumer_accepts_groups) {
  sender_session s;
  const auto lim = small_limits(feature_blob_groups);
  s.connect(lim);
  consumer c(lim);
  blob_group g;
  g.id = 42;
  g.size = 3;
  sender_blob b(tag_of('b'), g);
  planner p;
  send_entry(s, b, p, "x", pattern(4, 1));
  BOOST_REQUIRE(c.feed(s.out()));
  BOOST_TEST(c.rec.lines.at(1) == "group 1 size 3");
}

// ---- refusals -----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(every_refusal_names_its_limit) {
  sender_session s;
  auto lim = small_limits();
  s.connect(lim);
  sender_blob b(tag_of('r'));
  planner p;

  auto key = s.check_emit(b, 65);
  BOOST_TEST((key.code() == errc::invalid_argument));
  BOOST_TEST(key.message().find("max_key_bytes (64 bytes)") != std::string::npos, key.message());
  BOOST_TEST(s.check_emit(b, 64));

  blob_group g;
  g.size = 2;
  sender_blob grouped(tag_of('g'), g);
  auto group = s.check_emit(grouped, 1);
  BOOST_TEST((group.code() == errc::invalid_argument));
  BOOST_TEST(group.message().find("group") != std::string::npos, group.message());
  BOOST_TEST((s.check_finish(grouped).code() == errc::invalid_argument));

  // A meta longer than max_meta_bytes: a shape of many dimensions.
  Entry e;
  e.key = "k";
  e.kind = 't';
  e.dtype = "uint8";
  e.shape = shape_t(250, 1);
  e.len = 1;
  const auto meta = e.meta();
  BOOST_REQUIRE(meta.size() > 200u);
  auto long_meta = s.plan_entry(b, e, meta);
  BOOST_TEST((long_meta.code() == errc::invalid_argument));
  BOOST_TEST(long_meta.message().find("max_meta_bytes (200 bytes)") != std::string::npos,
             long_meta.message());
  // Planned and not sent: the blob is broken, only abort() is left.
  BOOST_TEST(b.broken());
  BOOST_TEST((s.check_emit(b, 1).code() == errc::closed));
  BOOST_TEST((s.check_finish(b).code() == errc::closed));
  BOOST_TEST((s.finish(b, {}).code() == errc::closed));

  // Credit that would not fit 64 bits.
  sender_blob huge(tag_of('h'));
  Entry big;
  big.key = "k";
  big.len = u64_max - 10;
  auto overflow = s.plan_entry(huge, big, std::span(meta).first(4));
  BOOST_TEST((overflow.code() == errc::too_large));
  BOOST_TEST(overflow.message().find("overflows") != std::string::npos, overflow.message());

  // Ended blobs refuse everything but abort (a no-op).
  sender_blob done(tag_of('d'));
  planner pd;
  send_entry(s, done, pd, "x", pattern(4, 1));
  finish_blob(s, done, pd);
  BOOST_TEST((s.check_emit(done, 1).code() == errc::closed));
  BOOST_TEST((s.check_finish(done).code() == errc::closed));
  BOOST_TEST((s.finish(done, {}).code() == errc::closed));
  BOOST_TEST(!s.abort(done, "late"));
}

BOOST_AUTO_TEST_CASE(the_consumers_max_entry_bytes_comes_from_its_hello_extension) {
  hello answer{.role = wire_role::consumer, .window_bytes = 1 << 20};
  // None announced: no limit.
  BOOST_TEST(sender_limits::from_hello(answer).max_entry_bytes == u64_max);
  answer.extensions.push_back(hello_extension{.type = 0x7fff, .value = pattern(3, 1)});
  answer.extensions.push_back(max_entry_bytes_extension(1000));
  // Through the wire codec, beside an extension of a type nobody knows.
  auto decoded = decode_hello(encode_hello(answer));
  BOOST_REQUIRE(decoded);
  BOOST_TEST(sender_limits::from_hello(*decoded).max_entry_bytes == 1000u);
}

BOOST_AUTO_TEST_CASE(a_max_entry_bytes_extension_of_the_wrong_length_is_a_violation) {
  for (const std::size_t n : {0, 4, 7, 9}) {
    hello answer{.role = wire_role::consumer, .window_bytes = 1 << 20};
    answer.extensions.push_back(
        hello_extension{.type = hello_ext_max_entry_bytes, .value = pattern(n, 2)});
    auto r = read_max_entry_bytes(answer);
    BOOST_TEST((r.code() == errc::protocol_violation), n);
    BOOST_TEST(r.message().find("max_entry_bytes extension") != std::string::npos, r.message());
  }
  hello good{.role = wire_role::consumer, .window_bytes = 1 << 20};
  good.extensions.push_back(max_entry_bytes_extension(u64_max - 1));
  auto r = read_max_entry_bytes(good);
  BOOST_REQUIRE(r);
  BOOST_TEST(r->value() == u64_max - 1);
}

BOOST_AUTO_TEST_CASE(an_entry_over_max_entry_bytes_is_refused_before_any_byte_is_framed) {
  sender_session s;
  auto lim = small_limits();
  lim.max_entry_bytes = 300;
  s.connect(lim);
  consumer c(lim);
  sender_blob b(tag_of('m'));
  planner p;
  auto over = s.check_emit(b, 1, 301);
  BOOST_TEST((over.code() == errc::invalid_argument));
  BOOST_TEST(over.message().find("301 bytes, over the consumer's max_entry_bytes 300") !=
                 std::string::npos,
             over.message());
  // Nothing framed, and the blob goes on: an entry at the limit, a tail.
  BOOST_TEST(s.out().pieces().empty());
  BOOST_TEST(!b.broken());
  BOOST_TEST(s.check_emit(b, 1, 300));
  send_entry(s, b, p, "k", pattern(300, 3));
  finish_blob(s, b, p);
  BOOST_REQUIRE(c.feed(s.out()));
  BOOST_TEST(c.rec.lines.back() == "complete 1");
  const bool landed_whole = c.rec.landed[{1, 0}] == pattern(300, 3);
  BOOST_TEST(landed_whole);
}

BOOST_AUTO_TEST_CASE(after_a_failure_every_call_refuses_with_that_error) {
  sender_session s;
  s.connect(small_limits());
  sender_blob b(tag_of('f'));
  planner p;
  send_entry(s, b, p, "x", pattern(4, 1));
  s.out().clear();
  s.fail(make_error_code(errc::peer_closed));
  s.fail(make_error_code(errc::timed_out));  // the first error wins
  BOOST_TEST((s.error() == errc::peer_closed));
  BOOST_TEST((s.check_emit(b, 1).code() == errc::peer_closed));
  BOOST_TEST((s.check_finish(b).code() == errc::peer_closed));
  BOOST_TEST((s.finish(b, {}).code() == errc::peer_closed));
  BOOST_TEST(!s.abort(b, "x"));  // nothing framed after a failure
  BOOST_TEST(s.out().empty());
}

// sender_session.hpp consume: the consumer speaks only after our hello
// (offer); bytes before it are a violation, not decoded as a hello.
BOOST_AUTO_TEST_CASE(bytes_from_the_consumer_before_our_hello_are_a_violation) {
  sender_session s;
  outbox o;
  frame_hello(o, hello{.role = wire_role::consumer, .window_bytes = 1 << 20});
  const auto bytes = flat(o);
  auto r = s.consume(bytes);
  BOOST_TEST_REQUIRE(!r.has_value());
  BOOST_TEST((r.code() == errc::protocol_violation), r.message());
  BOOST_TEST(r.message().find("before our hello") != std::string::npos, r.message());
}

BOOST_AUTO_TEST_CASE(resend_sessions_refuse_a_blob_without_a_tag) {
  sender_session s({.resend = true});
  s.connect(small_limits());
  sender_blob b(NO_TAG);
  auto r = s.check_emit(b, 1);
  BOOST_TEST((r.code() == errc::invalid_argument));
  BOOST_TEST(r.message().find("NO_TAG") != std::string::npos, r.message());
  BOOST_TEST((s.check_finish(b).code() == errc::invalid_argument));
}

// ---- credit -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(credit_is_taken_within_the_window_and_one_oversized_entry_goes_alone) {
  sender_session s;
  auto lim = small_limits();
  lim.window_bytes = 1000;
  s.connect(lim);
  BOOST_TEST(s.take_credit(600));
  BOOST_TEST(s.take_credit(400));      // exactly full
  BOOST_TEST(!s.take_credit(1));
  BOOST_TEST(s.in_flight() == 1000u);
  auto back = s.on_ack(1000, 0);
  BOOST_TEST(back);
  BOOST_TEST(s.in_flight() == 0u);
  BOOST_TEST(s.take_credit(5000));     // larger than the window, nothing outstanding: alone
  BOOST_TEST(!s.take_credit(1));       // ...and nothing beside it
  BOOST_TEST(s.take_credit(0));        // an empty take always fits
  BOOST_REQUIRE(s.on_ack(5000, 0));
  BOOST_TEST(s.take_credit(1));
  BOOST_TEST(!s.take_credit(5000));    // something outstanding: it waits
}

BOOST_AUTO_TEST_CASE(an_ack_returning_more_than_is_in_flight_is_a_violation_naming_both) {
  sender_session s;
  s.connect(small_limits());
  BOOST_REQUIRE(s.take_credit(100));
  auto r = s.on_ack(101, 0);
  BOOST_TEST((r.code() == errc::protocol_violation));
  BOOST_TEST(r.message() == "ack returns 101 credit bytes, 100 in flight");
  BOOST_TEST(s.in_flight() == 100u);  // nothing taken from a refused ack
  auto d = s.on_ack(100, 3);
  BOOST_TEST((d.code() == errc::protocol_violation));
  BOOST_TEST(d.message() == "ack delivers blob 3 to a sender without a resend session");
}

BOOST_AUTO_TEST_CASE(grants_return_held_credit_first_then_widen_the_window_saturating) {
  sender_session s;
  auto lim = small_limits(feature_credit_grants);
  lim.window_bytes = 0;  // a pooled consumer may grant nothing at first
  s.connect(lim);
  BOOST_TEST(!s.take_credit(10));  // with grants nothing goes beyond what was granted
  s.ask_credit(10);
  s.ask_credit(5);
  BOOST_TEST(s.credit_wanted() == 15u);
  BOOST_TEST(s.counts().credit_waits == 2u);
  BOOST_TEST(s.counts().credit_requests == 2u);
  {
    consumer c(lim);
    // A credit request is an ack frame from the sender: the consumer's
    // decoder takes it (on_credit_request), so decoding succeeds.
    BOOST_TEST(c.feed(s.out()));
  }
  BOOST_REQUIRE(s.on_ack(100, 0));
  BOOST_TEST(s.window_bytes() == 100u);
  BOOST_TEST(s.take_credit(60));
  BOOST_REQUIRE(s.on_ack(80, 0));  // 60 held come back, 20 widen the window
  BOOST_TEST(s.in_flight() == 0u);
  BOOST_TEST(s.window_bytes() == 120u);
  s.withdraw_credit(10, s.connection());
  BOOST_TEST(s.credit_wanted() == 5u);
  s.withdraw_credit(100, s.connection());  // never below zero
  BOOST_TEST(s.credit_wanted() == 0u);
  // A hostile pool granting 2^64 - 1 twice: the window saturates.
  BOOST_REQUIRE(s.on_ack(u64_max, 0));
  BOOST_REQUIRE(s.on_ack(u64_max, 0));
  BOOST_TEST(s.window_bytes() == u64_max);
  BOOST_TEST(s.take_credit(u64_max));
  BOOST_TEST(!s.take_credit(1));
}

BOOST_AUTO_TEST_CASE(a_reconnect_starts_credit_and_blob_ids_over) {
  sender_session s;
  auto lim = small_limits(feature_credit_grants);
  s.connect(lim);
  BOOST_REQUIRE(s.take_credit(100));
  s.ask_credit(50);
  const auto old = s.connection();
  s.connect(lim);
  BOOST_TEST(s.connection() == old + 1);
  BOOST_TEST(s.in_flight() == 0u);
  BOOST_TEST(s.credit_wanted() == 0u);
  s.ask_credit(7);
  s.withdraw_credit(50, old);  // the replaced connection's wait: ignored
  BOOST_TEST(s.credit_wanted() == 7u);
  sender_blob b(tag_of('n'));
  planner p;
  send_entry(s, b, p, "x", pattern(4, 1));
  BOOST_TEST(b.id() == 1u);
}

BOOST_AUTO_TEST_CASE(the_session_counts_connections_after_the_first_as_reconnects) {
  sender_session s;
  s.connect(small_limits());
  BOOST_TEST(s.counts().reconnects == 0u);
  s.connect(small_limits());
  s.connect(small_limits());
  BOOST_TEST(s.counts().reconnects == 2u);
  // A wait it was only told of counts as an asked one does.
  s.ask_credit(10);
  s.note_credit_wait();
  BOOST_TEST(s.counts().credit_waits == 2u);
}

BOOST_AUTO_TEST_CASE(an_ask_without_grants_counts_the_wait_and_frames_nothing) {
  sender_session s;
  s.connect(small_limits());
  s.ask_credit(10);
  BOOST_TEST(s.counts().credit_waits == 1u);
  BOOST_TEST(s.counts().credit_requests == 0u);
  BOOST_TEST(s.out().empty());
  BOOST_TEST(s.credit_wanted() == 0u);
}

// ---- resend sessions ----------------------------------------------------------

namespace {

/// A producer's emit in a resend session: list, admit, keep.
void keep(sender_session& s, const std::shared_ptr<sender_blob>& b, planner& p, std::string key,
          std::vector<std::byte> bytes, std::uint64_t ns = 5) {
  BOOST_REQUIRE(s.check_emit(*b, key.size()));
  const planned_entry& pe = p.add(std::move(key), std::move(bytes));
  BOOST_REQUIRE(s.plan_entry(*b, pe.entry, p.meta));
  BOOST_REQUIRE(s.list(b));
  const std::uint64_t n = pe.entry.len + pe.entry.key.size() + p.meta.size();
  BOOST_REQUIRE(s.admit(*b, n));
  kept_entry k{pe.entry, p.meta, std::vector<std::byte>(pe.source.data, pe.source.data + pe.entry.len), ns};
  s.keep_entry(*b, std::move(k));
}

void keep_tail(sender_session& s, const std::shared_ptr<sender_blob>& b, planner& p) {
  BOOST_REQUIRE(s.check_finish(*b));
  auto t = p.tail(b->tag());
  BOOST_REQUIRE(s.list(b));
  BOOST_REQUIRE(s.admit(*b, t.size()));
  BOOST_REQUIRE(s.finish(*b, t));
}

/// resend.cpp's sync loop: frames what this connection has not seen of `b`.
void sync(sender_session& s, sender_blob& b) {
  s.begin_sync(b);
  for (;;) {
    const auto step = s.next_step(b);
    if (step == sync_step::none) break;
    if (step == sync_step::entry) {
      BOOST_REQUIRE(s.take_credit(s.kept_credit(b)));
      const kept_entry& k = b.kept()[b.entries()];
      auto room = s.send_kept_entry(b);
      if (!room.empty()) {
        std::memcpy(room.data(), k.bytes.data(), k.bytes.size());
      } else {
        for (std::size_t at = 0; at < k.bytes.size();) at += s.add_chunk(b, std::span(k.bytes).subspan(at));
      }
      BOOST_REQUIRE(s.entry_sent(b));
      continue;
    }
    if (step == sync_step::tail) BOOST_REQUIRE(s.take_credit(s.tail_bytes(b)));
    s.send_kept_end(b, step);
  }
  s.end_sync(b);
}

}  // namespace

BOOST_AUTO_TEST_CASE(after_a_reconnect_only_undelivered_blobs_are_sent_again_from_their_start) {
  sender_session s({.resend = true});
  const auto lim = small_limits();
  s.connect(lim);
  auto a = std::make_shared<sender_blob>(tag_of('a'));
  auto b = std::make_shared<sender_blob>(tag_of('b'));
  auto open = std::make_shared<sender_blob>(tag_of('o'));
  planner pa, pb, po;
  keep(s, a, pa, "a0", pattern(40, 1));
  keep(s, a, pa, "a1", pattern(300, 2));
  keep_tail(s, a, pa);
  sync(s, *a);
  keep(s, b, pb, "b0", pattern(10, 3));
  keep_tail(s, b, pb);
  sync(s, *b);
  keep(s, open, po, "o0", pattern(10, 4));
  sync(s, *open);
  BOOST_TEST(s.synced(*open));
  keep(s, open, po, "o1", pattern(10, 5));  // kept after its sync: not synced
  BOOST_TEST(!s.synced(*open));
  BOOST_TEST(s.to_resync().size() == 1u);
  sync(s, *open);
  BOOST_TEST(s.synced(*a));
  BOOST_TEST(s.to_resync().empty());
  {
    consumer c(lim);
    BOOST_REQUIRE(c.feed(s.out()));
    const std::vector<std::string> want = {"begin 1 a", "entry 1/0 a0", "entry 1/1 a1",
                                           "complete 1", "begin 2 b", "entry 2/0 b0",
                                           "complete 2", "begin 3 o", "entry 3/0 o0",
                                           "entry 3/1 o1"};
    BOOST_TEST(c.rec.lines == want, boost::test_tools::per_element());
  }
  // The consumer delivered `a` (id 1) before the connection broke.
  auto delivered = s.on_ack(0, 1);
  BOOST_REQUIRE(delivered);
  BOOST_TEST(delivered->get() == a.get());
  BOOST_TEST(a->delivered());
  BOOST_TEST(a->kept().empty());  // its bytes are freed
  BOOST_TEST(s.kept_blobs() == 2u);
  // Delivered once: a second ack for it is a violation.
  auto again = s.on_ack(0, 1);
  BOOST_TEST((again.code() == errc::protocol_violation));
  BOOST_TEST(again.message() == "ack for blob 1, not awaiting delivery");

  s.connect(lim);
  auto todo = s.to_resync();
  BOOST_TEST_REQUIRE(todo.size() == 2u);  // b and the open blob, oldest first
  BOOST_TEST(todo[0].get() == b.get());
  BOOST_TEST(todo[1].get() == open.get());
  for (auto& k : todo) sync(s, *k);
  consumer c2(lim);
  BOOST_REQUIRE(c2.feed(s.out()));
  const std::vector<std::string> want2 = {"begin 1 b", "entry 1/0 b0", "complete 1", "begin 2 o",
                                          "entry 2/0 o0", "entry 2/1 o1"};
  BOOST_TEST(c2.rec.lines == want2, boost::test_tools::per_element());
  BOOST_TEST((c2.rec.landed[{1, 0}] == pattern(10, 3)));
  BOOST_TEST(s.counts().blobs_resent == 2u);
  // Counted once, when kept, however often sent.
  BOOST_TEST(s.counts().entries_sent == 5u);
  BOOST_TEST(s.counts().blobs_sent == 2u);
  // An ack on the new connection names the new id.
  auto db = s.on_ack(0, 1);
  BOOST_REQUIRE(db);
  BOOST_TEST(db->get() == b.get());
  BOOST_TEST(s.counts().blobs_delivered == 2u);
  BOOST_TEST(!s.ended_pending());  // only the open blob is kept
}

BOOST_AUTO_TEST_CASE(a_blob_delivered_while_being_resent_ends_with_delivered_already) {
  sender_session s({.resend = true});
  const auto lim = small_limits();
  s.connect(lim);
  auto a = std::make_shared<sender_blob>(tag_of('a'));
  planner p;
  keep(s, a, p, "a0", pattern(10, 1));
  keep(s, a, p, "a1", pattern(10, 2));
  keep_tail(s, a, p);
  s.out().clear();
  s.connect(lim);
  s.begin_sync(*a);
  BOOST_TEST((s.next_step(*a) == sync_step::entry));
  BOOST_REQUIRE(s.take_credit(s.kept_credit(*a)));
  auto room = s.send_kept_entry(*a);
  std::memcpy(room.data(), a->kept()[0].bytes.data(), 10);
  BOOST_REQUIRE(s.entry_sent(*a));
  BOOST_REQUIRE(s.on_ack(0, a->id()));  // the consumer had it from before
  BOOST_TEST(a->kept().size() == 2u);   // still being framed: kept until end_sync
  // No further entry of it: the blob ends on this connection instead.
  BOOST_TEST((s.next_step(*a) == sync_step::abort));
  s.send_kept_end(*a, sync_step::abort);
  BOOST_TEST((s.next_step(*a) == sync_step::none));
  s.end_sync(*a);
  BOOST_TEST(a->kept().empty());
  consumer c(lim);
  BOOST_REQUIRE(c.feed(s.out()));
  BOOST_TEST(c.rec.lines.back() == "abort 1 delivered already");
}

BOOST_AUTO_TEST_CASE(an_aborted_blob_is_forgotten_unless_a_consumer_heard_of_it) {
  sender_session s({.resend = true});
  s.connect(small_limits());
  auto never = std::make_shared<sender_blob>(tag_of('n'));
  auto heard = std::make_shared<sender_blob>(tag_of('h'));
  planner pn, ph;
  keep(s, never, pn, "x", pattern(4, 1));
  keep(s, heard, ph, "y", pattern(4, 2));
  sync(s, *heard);
  BOOST_TEST(!s.abort(*never, "stop"));  // never on a wire: forgotten
  BOOST_TEST(s.kept_blobs() == 1u);
  BOOST_TEST(s.abort(*heard, "stop"));   // must be told
  BOOST_TEST(!s.abort(*heard, "twice"));
  BOOST_TEST(s.counts().blobs_aborted == 2u);
  BOOST_TEST(s.ended_pending());
  s.out().clear();
  s.connect(small_limits());
  sync(s, *heard);
  consumer c(small_limits());
  BOOST_REQUIRE(c.feed(s.out()));
  const std::vector<std::string> want = {"begin 1 h", "abort 1 stop"};  // no entries resent
  BOOST_TEST(c.rec.lines == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(the_unacked_budget_bounds_kept_bytes_except_for_the_oldest_blob) {
  sender_session s({.resend = true, .unacked_bytes = 100});
  auto lim = small_limits();
  lim.dedup_window = 2;
  s.connect(lim);
  auto a = std::make_shared<sender_blob>(tag_of('a'));
  auto b = std::make_shared<sender_blob>(tag_of('b'));
  auto c = std::make_shared<sender_blob>(tag_of('c'));
  BOOST_TEST(s.list(a));
  BOOST_TEST(s.list(b));
  BOOST_TEST(!s.list(c));  // the consumer remembers 2 blobs
  BOOST_TEST(s.admit(*b, 60));
  BOOST_TEST(!s.admit(*b, 41));   // 101 > 100
  BOOST_TEST(s.admit(*b, 40));    // exactly 100
  BOOST_TEST(s.admit(*a, 1000));  // the oldest always proceeds
  BOOST_TEST(s.kept_bytes() == 1100u);
  s.refund(*a, 1000);
  BOOST_TEST(s.kept_bytes() == 100u);
  BOOST_TEST(!s.admit(*b, u64_max));  // no overflow past the budget
  s.note_budget_wait();
  BOOST_TEST(s.counts().budget_waits == 1u);
  s.forget(a);
  BOOST_TEST(s.list(c));
}

// ---- the consumer's bytes: hello answer, acks, close --------------------------

namespace {

/// Our hello as a sender offers it (a session when `session`).
hello offer_of(bool session = false) {
  hello h{.role = wire_role::sender, .max_chunk_bytes = 4096,
          .features = feature_blob_groups | feature_credit_grants | feature_entry_timestamps,
          .inline_bytes = 256};
  if (session) h.session[0] = std::byte{7};
  return h;
}

/// The valid answer to `offer`.
hello answer_to(const hello& offer) {
  hello r{.role = wire_role::consumer};
  r.max_chunk_bytes = offer.max_chunk_bytes;
  r.inline_bytes = offer.inline_bytes;
  r.window_bytes = 1u << 20;
  r.session = offer.session;
  r.dedup_window = offer.session != NO_SESSION ? 64 : 0;
  r.features = offer.features & ~feature_credit_grants;
  r.extensions.push_back(max_entry_bytes_extension(1u << 20));
  return r;
}

/// `bytes` cut whole, byte by byte, and in three seeded random chunkings.
std::vector<std::vector<std::span<const std::byte>>> chunkings(const std::vector<std::byte>& bytes) {
  std::vector<std::vector<std::span<const std::byte>>> all;
  const std::span<const std::byte> whole(bytes);
  all.push_back({whole});
  std::vector<std::span<const std::byte>> ones;
  for (std::size_t i = 0; i < bytes.size(); ++i) ones.push_back(whole.subspan(i, 1));
  all.push_back(ones);
  for (unsigned seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    std::vector<std::span<const std::byte>> cut;
    for (std::size_t at = 0; at < bytes.size();) {
      const std::size_t n = std::min<std::size_t>(bytes.size() - at, 1 + rng() % 40);
      cut.push_back(whole.subspan(at, n));
      at += n;
    }
    all.push_back(cut);
  }
  return all;
}

/// What the consumer's bytes brought, fed in one chunking (the events of
/// every call merged), or the first error.
struct fed {
  std::error_code ec;
  std::string message;
  sender_input in;
};

fed feed_all(sender_session& s, const std::vector<std::span<const std::byte>>& chunks) {
  fed f;
  for (auto c : chunks) {
    auto r = s.consume(c);
    if (!r) {
      f.ec = r.code();
      f.message = r.message();
      return f;
    }
    f.in.hello |= r->hello;
    f.in.acks += r->acks;
    f.in.closed |= r->closed;
    for (auto& b : r->delivered) f.in.delivered.push_back(b);
  }
  return f;
}

/// `answer` as the consumer frames it, then whatever `more` frames.
std::vector<std::byte> consumer_bytes(const hello& answer,
                                      const std::function<void(outbox&)>& more = {}) {
  outbox o;
  frame_hello(o, answer);
  if (more) more(o);
  return flat(o);
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_offer_frames_our_hello_and_a_valid_answer_is_taken_in_any_chunking) {
  for (const bool session : {false, true}) {
    const hello mine = offer_of(session);
    const hello answer = answer_to(mine);
    const auto bytes = consumer_bytes(answer);
    for (const auto& chunks : chunkings(bytes)) {
      sender_session s;
      outbox out;
      BOOST_TEST(s.offer(mine, out) == 1u);
      // Our hello, as the framer writes it.
      outbox expected;
      frame_hello(expected, mine);
      BOOST_TEST(flat(out) == flat(expected));
      BOOST_TEST(!s.answer());
      const fed f = feed_all(s, chunks);
      BOOST_TEST(!f.ec, f.message);
      BOOST_TEST(f.in.hello);
      BOOST_REQUIRE(s.answer());
      BOOST_TEST((*s.answer() == answer));
      BOOST_TEST(sender_limits::from_hello(*s.answer()).max_entry_bytes == 1u << 20);
    }
  }
}

BOOST_AUTO_TEST_CASE(each_check_of_the_answer_is_a_violation_naming_its_field) {
  struct altered {
    const char* what;
    bool session;
    std::function<void(hello&)> alter;
  };
  const std::vector<altered> cases = {
      {"chunk 4097 above the proposal", false, [](hello& r) { r.max_chunk_bytes = 4097; }},
      {"inline_bytes 257 above the proposal", false, [](hello& r) { r.inline_bytes = 257; }},
      {"zero window", false, [](hello& r) { r.window_bytes = 0; }},
      {"features that were not offered", false, [](hello& r) { r.features |= 1u << 3; }},
      {"no delivery log for this session", true, [](hello& r) { r.session[0] ^= std::byte{1}; }},
      {"no delivery log for this session", true, [](hello& r) { r.dedup_window = 0; }},
      {"max_entry_bytes extension (type 1) has 4 bytes", false,
       [](hello& r) { r.extensions[0].value.resize(4); }},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      const hello mine = offer_of(c.session);
      hello answer = answer_to(mine);
      c.alter(answer);
      BOOST_TEST((sender_session::check_answer(mine, answer).code() == errc::protocol_violation));
      const auto bytes = consumer_bytes(answer);  // (outlives the spans into it)
      for (const auto& chunks : chunkings(bytes)) {
        sender_session s;
        outbox out;
        (void)s.offer(mine, out);
        const fed f = feed_all(s, chunks);
        BOOST_TEST((f.ec == errc::protocol_violation), f.message);
        BOOST_TEST(f.message.find(c.what) != std::string::npos, f.message);
        BOOST_TEST(!s.answer());
      }
    }
  }
  // At the limits: the proposal itself, and a zero window with credit grants.
  const hello mine = offer_of();
  hello at = answer_to(mine);
  BOOST_TEST(sender_session::check_answer(mine, at));
  at.window_bytes = 0;
  at.features |= feature_credit_grants;
  BOOST_TEST(sender_session::check_answer(mine, at));
}

BOOST_AUTO_TEST_CASE(an_ack_before_the_handshake_ended_is_a_violation) {
  const hello mine = offer_of();
  const auto bytes = consumer_bytes(answer_to(mine), [](outbox& o) { frame_ack(o, 0, 0); });
  for (const auto& chunks : chunkings(bytes)) {
    sender_session s;
    outbox out;
    (void)s.offer(mine, out);
    const fed f = feed_all(s, chunks);
    BOOST_TEST((f.ec == errc::protocol_violation), f.message);
    BOOST_TEST(f.message.find("ack before the handshake ended") != std::string::npos, f.message);
  }
}

BOOST_AUTO_TEST_CASE(acks_after_connect_return_credit_and_a_close_keeps_its_reason) {
  const hello mine = offer_of();
  const std::string reason = "entry 'x' of 4096 bytes is over max_entry_bytes";
  const auto hello_bytes = consumer_bytes(answer_to(mine));
  outbox more;
  frame_ack(more, 60, 0);
  frame_ack(more, 40, 0);
  frame_close(more, reason);
  const auto rest = flat(more);
  const auto hellos = chunkings(hello_bytes);
  const auto rests = chunkings(rest);
  for (std::size_t i = 0; i < hellos.size(); ++i) {
    sender_session s;
    outbox out;
    (void)s.offer(mine, out);
    const fed h = feed_all(s, hellos[i]);
    BOOST_REQUIRE(h.in.hello);
    // The caller connects once the hello is in (as install() does).
    s.connect(sender_limits::from_hello(*s.answer()));
    BOOST_REQUIRE(s.take_credit(100));
    const fed f = feed_all(s, rests[i]);
    BOOST_TEST(!f.ec, f.message);
    BOOST_TEST(f.in.acks == 2u);
    BOOST_TEST(s.in_flight() == 0u);
    BOOST_TEST(f.in.closed);
    BOOST_TEST(s.peer_closed());
    BOOST_TEST(s.close_reason() == reason);
    // A new link forgets what the last one said.
    (void)s.offer(mine, out);
    BOOST_TEST(!s.peer_closed());
    BOOST_TEST(s.close_reason().empty());
    BOOST_TEST(!s.answer());
  }
}

BOOST_AUTO_TEST_CASE(an_ack_returning_more_than_is_in_flight_from_the_consumer_is_a_violation) {
  const hello mine = offer_of();
  outbox more;
  frame_ack(more, 1, 0);
  const auto rest = flat(more);
  for (const auto& chunks : chunkings(rest)) {
    sender_session s;
    outbox out;
    (void)s.offer(mine, out);
    BOOST_REQUIRE(s.consume(consumer_bytes(answer_to(mine))));
    s.connect(sender_limits::from_hello(*s.answer()));
    const fed f = feed_all(s, chunks);
    BOOST_TEST((f.ec == errc::protocol_violation), f.message);
    BOOST_TEST(f.message.find("ack returns 1 credit bytes, 0 in flight") != std::string::npos,
               f.message);
  }
}

// A resend session's kept entries must fit the consumer it reconnects to:
// one that would refuse a kept entry mid-stream is refused at its hello,
// naming the blob, the entry and the limit (check_kept).
BOOST_AUTO_TEST_CASE(a_reconnect_to_a_consumer_that_would_refuse_a_kept_entry_fails_its_handshake) {
  // Kept on a first connection with generous limits: a one-dim entry whose
  // msgpack meta is longer than its compact form (12 + 8 bytes).
  auto keep_one = [](sender_session& s) {
    auto lim = small_limits();
    s.connect(lim);
    auto b = std::make_shared<sender_blob>(tag_of('k'));
    planner p;
    keep(s, b, p, "a-key-of-20-bytes...", pattern(300, 1));
    return std::pair{b, p.meta.size()};
  };
  struct limit_case {
    const char* what;
    std::function<void(hello&, std::size_t meta)> alter;
    bool refused;
  };
  const std::vector<limit_case> cases = {
      {"the same limits", [](hello&, std::size_t) {}, false},
      {"max_key_bytes (19 bytes)", [](hello& r, std::size_t) { r.max_key_bytes = 19; }, true},
      {"max_key_bytes at the key", [](hello& r, std::size_t) { r.max_key_bytes = 20; }, false},
      {"max_meta_bytes", [](hello& r, std::size_t meta) { r.max_meta_bytes = meta - 1; }, true},
      {"max_meta_bytes at the meta",
       [](hello& r, std::size_t meta) { r.max_meta_bytes = static_cast<std::uint32_t>(meta); }, false},
      // The compact form (20 bytes) fits where the msgpack meta does not.
      {"max_meta_bytes, compact",
       [](hello& r, std::size_t meta) {
         r.features |= feature_compact_entries;
         r.max_meta_bytes = meta - 1;
       },
       false},
      {"max_entry_bytes 299",
       [](hello& r, std::size_t) { r.extensions = {max_entry_bytes_extension(299)}; }, true},
      {"max_entry_bytes at the entry",
       [](hello& r, std::size_t) { r.extensions = {max_entry_bytes_extension(300)}; }, false},
  };
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      sender_session s({.resend = true});
      auto [b, meta_bytes] = keep_one(s);
      BOOST_REQUIRE(meta_bytes > 20u);
      hello mine = offer_of(true);
      mine.features |= feature_compact_entries;
      hello answer = answer_to(mine);
      answer.features &= ~feature_compact_entries;
      answer.max_key_bytes = 64;
      answer.max_meta_bytes = 4096;
      c.alter(answer, meta_bytes);
      const auto bytes = consumer_bytes(answer);
      outbox out;
      (void)s.offer(mine, out);
      const fed f = feed_all(s, chunkings(bytes)[0]);
      if (c.refused) {
        BOOST_TEST((f.ec == errc::protocol_violation), f.message);
        BOOST_TEST(f.message.find("kept blob " + tag_hex(b->tag()) + ", entry 0") !=
                       std::string::npos, f.message);
        BOOST_TEST(f.message.find(c.what) != std::string::npos, f.message);
        BOOST_TEST(!s.answer());
      } else {
        BOOST_TEST(!f.ec, f.message);
        BOOST_TEST(f.in.hello);
      }
      // A session that keeps nothing takes any of these answers.
      sender_session plain;
      outbox out2;
      (void)plain.offer(mine, out2);
      BOOST_TEST(!feed_all(plain, chunkings(bytes)[0]).ec);
    }
  }
  // An aborted blob's entries are not sent again: they need not fit.
  sender_session s({.resend = true});
  auto [b, meta_bytes] = keep_one(s);
  sync(s, *b);
  BOOST_REQUIRE(s.abort(*b, "stop"));
  hello mine = offer_of(true);
  hello answer = answer_to(mine);
  answer.max_key_bytes = 4;
  outbox out;
  (void)s.offer(mine, out);
  BOOST_TEST(!feed_all(s, chunkings(consumer_bytes(answer))[0]).ec);
}
