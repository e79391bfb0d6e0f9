// The sans-IO receiving half (blobpipe/protocol/consumer_session.hpp),
// driven with bytes and calls and no socket, as the decoder's tests drive
// the decoder: each stream is fed whole, one byte at a time, in seeded
// random chunkings and through payload_target()/commit_payload(), and
// every way must report the same events to the listener and leave the same
// frames in the outbox (decoded with the project's own push decoder, as a
// sender reads them). Each receive rule the session owns has a case: the
// hello's answer, credit requests and grants, releases to the sender or
// the pool, the held allowance, acks per batch (one per blob delivered in a
// resend session), duplicates, the close frame with its reason, and the
// clocks (stall, idle, held, credit pressure) with the time fed in by the
// test: a wait on the sender is open between the steps, as in a consumer
// that reads, and the test's timer calls on_time().
#define BOOST_TEST_MODULE consumer_session_test
#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "blobpipe/protocol/consumer_session.hpp"
#include "test/wire_vectors.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;
using namespace blobpipe::testing::vectors_detail;

namespace {

using time_point = consumer_session::time_point;
using ms = std::chrono::milliseconds;
const time_point t0 = time_point{} + std::chrono::hours(1);

std::vector<std::uint8_t> pattern(std::size_t n, unsigned seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed * 31 + i * 7 + (i >> 8));
  return v;
}

value bytes_value(const std::vector<std::uint8_t>& v) {
  return value::ndarray_bytes(std::as_bytes(std::span(v)), "|u1",
                              {static_cast<std::int64_t>(v.size())});
}

session_id session_of(char c) {
  session_id s{};
  s.fill(static_cast<std::byte>(c));
  return s;
}

/// A delivery log of the test's own (delivered_tags).
struct tag_log final : delivered_tags {
  std::set<std::pair<session_id, tag_t>> tags;
  bool contains(const session_id& s, const tag_t& t) const override {
    return tags.count({s, t}) != 0;
  }
  void record(const session_id& s, const tag_t& t) override { tags.insert({s, t}); }
};

/// The listener: records each event as a line, lands each entry's bytes,
/// and releases an entry's credit when it completes (unless `hold`).
class sinks final : public consumer_session_listener {
 public:
  struct blob : session_blob {
    std::vector<std::byte> cur;        // the entry receiving bytes
    std::uint64_t cur_index = 0;
    std::uint64_t cur_credit = 0;
  };

  consumer_session* s = nullptr;
  bool hold = false;
  bool fail_tails = false;          // blob_complete: the sink fails
  bool refuse_begins = false;       // blob_begin returns an error
  bool refuse_tails = false;        // blob_complete returns an error
  std::uint64_t initial_grant = 4096;
  bool pressed = false;             // pool_pressed()
  std::vector<std::string> lines;
  std::map<std::uint64_t, std::unique_ptr<blob>> blobs;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::byte>> landed;
  std::vector<std::uint64_t> kept;  // credit of entries held (hold)
  std::uint64_t entry_credit = 0;   // all entries announced
  std::uint64_t tail_credit = 0;    // all tails completed
  int acks_due_calls = 0;

  result<session_blob*> blob_begin(std::uint64_t id, const tag_t& tag, bool duplicate) override {
    lines.push_back("begin " + std::to_string(id) + " " + static_cast<char>(tag[0]) +
                    (duplicate ? " duplicate" : ""));
    if (refuse_begins) return error{errc::too_large, "the sink refuses the blob"};
    auto& b = blobs[id];
    b = std::make_unique<blob>();
    return static_cast<session_blob*>(b.get());
  }
  result<std::span<std::byte>> entry_begin(session_blob& sb, const entry_announcement& a) override {
    auto& b = static_cast<blob&>(sb);
    entry_credit += a.credit;
    b.cur_index = a.index;
    b.cur_credit = a.credit;
    if (b.discard) return std::span<std::byte>{};
    lines.push_back("entry " + std::to_string(b.id) + "/" + std::to_string(a.index) + " " +
                    a.entry->key);
    b.cur.assign(a.entry->len, std::byte{0xEE});
    return std::span<std::byte>(b.cur);
  }
  result<void> entry_complete(session_blob& sb) override {
    auto& b = static_cast<blob&>(sb);
    if (!b.discard) {
      lines.push_back("entry_complete " + std::to_string(b.id) + "/" +
                      std::to_string(b.cur_index));
      landed[{b.id, b.cur_index}] = b.cur;
    }
    if (hold) kept.push_back(b.cur_credit);
    else s->release(b.cur_credit);
    return {};
  }
  result<bool> blob_complete(session_blob& sb, blob_index index,
                             std::span<const std::byte> tail) override {
    tail_credit += tail.size();
    if (refuse_tails) return error{errc::too_large, "the sink refuses the tail"};
    if (fail_tails) {
      blob_abort(sb, make_error_code(errc::io), "disk full", false);
      return false;
    }
    lines.push_back("complete " + std::to_string(sb.id) + " rows=" +
                    std::to_string(index.entries.size()));
    return true;
  }
  void blob_abort(session_blob& b, std::error_code ec, std::string reason, bool resend) override {
    if (!b.discard)
      lines.push_back("abort " + std::to_string(b.id) + " " + errc_name(ec) + " " + reason +
                      (resend ? " resend" : ""));
    b.discard = true;
  }
  void blob_end(session_blob& b) override { blobs.erase(b.id); }
  void blob_in_group(session_blob& b, const blob_group& g) override {
    lines.push_back("group " + std::to_string(b.id) + " size " + std::to_string(g.size));
  }
  void closed(std::string_view reason) override {
    lines.push_back("closed " + std::string(reason));
  }
  std::uint64_t pool_join() override {
    lines.push_back("join");
    return initial_grant;
  }
  void pool_request(std::uint64_t n) override { lines.push_back("request " + std::to_string(n)); }
  void pool_released(std::uint64_t n) override {
    lines.push_back("pool released " + std::to_string(n));
  }
  void acks_due() override { ++acks_due_calls; }
  bool pool_pressed() override { return pressed; }
};

/// The frames in a session's outbox, as the sender's decoder reads them.
struct sent_frames final : decoder_listener {
  std::optional<hello> answer;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> acks;  // (credit, blob id)
  std::optional<std::string> close;
  result<void> r;

  result<void> on_hello(const hello& h) override {
    answer = h;
    return {};
  }
  result<void> on_ack(std::uint64_t credit, std::uint64_t id) override {
    acks.emplace_back(credit, id);
    return {};
  }
  result<void> on_close(std::string_view reason) override {
    close = std::string(reason);
    return {};
  }
  std::uint64_t ack_credit() const {
    std::uint64_t n = 0;
    for (auto [c, id] : acks) n += c;
    return n;
  }
  std::vector<std::uint64_t> delivered() const {
    std::vector<std::uint64_t> v;
    for (auto [c, id] : acks)
      if (id != 0) v.push_back(id);
    return v;
  }
};

sent_frames read_outbox(const outbox& o) {
  sent_frames f;
  decoder d(wire_role::consumer, {}, f);
  f.r = d.consume(bytes_of(o));
  return f;
}

/// How bytes reach the session.
enum class feeding { whole, bytewise, random, landed };

std::string name_of(feeding f, unsigned seed) {
  switch (f) {
    case feeding::whole: return "whole";
    case feeding::bytewise: return "one byte at a time";
    case feeding::random: return "random chunks, seed " + std::to_string(seed);
    case feeding::landed: return "payloads landed with payload_target/commit_payload";
  }
  return "?";
}

/// One step of a scenario at `at` after t0: bytes arriving, a call to make
/// between them, or the caller's timer firing (on_time).
struct step {
  std::vector<std::byte> bytes;
  std::function<void(consumer_session&, sinks&, time_point)> call;
  ms at{0};
  bool timer = false;
};
step bytes(const outbox& o, ms at = ms(0)) { return {bytes_of(o), {}, at}; }
step call(std::function<void(consumer_session&, sinks&, time_point)> f, ms at = ms(0)) {
  return {{}, std::move(f), at};
}
step timer(ms at) { return {{}, {}, at, true}; }

const char* name_of(clock_expiry::limit l) {
  switch (l) {
    case clock_expiry::limit::stall: return "stall";
    case clock_expiry::limit::idle: return "idle";
    case clock_expiry::limit::held: return "held";
    case clock_expiry::limit::pressed: return "pressed";
  }
  return "?";
}

struct scenario {
  consumer_session_options opt;
  bool hold = false;
  bool fail_tails = false;
  std::uint64_t initial_grant = 4096;
  std::vector<step> steps{};
  bool refuse_begins = false;
  bool refuse_tails = false;
};

struct outcome {
  std::vector<std::string> lines;
  result<void> r;
  sent_frames sent;                // the outbox after frame_acks() at the end
  consumer_session_counts counts;
  std::uint64_t buffered = 0;
  std::uint64_t window = 0;
  std::uint64_t credit_wanted = 0;
  std::uint64_t entry_credit = 0;
  std::uint64_t tail_credit = 0;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::byte>> landed;
  std::vector<std::string> reasons;  // of the clocks that expired
};

result<void> feed(consumer_session& s, std::span<const std::byte> in, feeding f,
                  std::mt19937& rng, time_point now) {
  std::size_t at = 0;
  while (at < in.size()) {
    const std::size_t left = in.size() - at;
    std::size_t n = left;
    switch (f) {
      case feeding::whole: break;
      case feeding::bytewise: n = 1; break;
      case feeding::random:
        n = rng() % 4 == 0 ? 1 + rng() % left : 1 + rng() % std::min<std::size_t>(left, 40);
        break;
      case feeding::landed:
        if (s.frames().in_payload()) {
          n = static_cast<std::size_t>(std::min<std::uint64_t>(s.frames().payload_remaining(), left));
          auto target = s.payload_target();
          std::memcpy(target.data(), in.data() + at, n);
          if (auto r = s.commit_payload(n, now); !r) return r;
          at += n;
          continue;
        }
        n = std::min(std::max<std::size_t>(s.frames().next_required_size(), 1), left);
        break;
    }
    if (auto r = s.consume(in.subspan(at, n), now); !r) return r;
    at += n;
  }
  return {};
}

outcome run(const scenario& sc, feeding f, unsigned seed) {
  sinks l;
  l.hold = sc.hold;
  l.fail_tails = sc.fail_tails;
  l.refuse_begins = sc.refuse_begins;
  l.refuse_tails = sc.refuse_tails;
  l.initial_grant = sc.initial_grant;
  consumer_session s(sc.opt, l);
  l.s = &s;
  std::mt19937 rng(seed);
  result<void> r;
  std::vector<std::string> reasons;
  // A wait on the sender is open throughout, as in a consumer reading:
  // bytes end it (what they brought counts) and the next begins at once.
  s.wait_begins(t0, false);
  for (const auto& st : sc.steps) {
    const time_point now = t0 + st.at;
    if (st.call) st.call(s, l, now);
    if (st.timer) {
      if (auto e = s.on_time(now)) {
        l.lines.push_back(std::string("expired ") + name_of(e->which));
        reasons.push_back(e->reason);
      }
    }
    if (!st.bytes.empty()) {
      r = feed(s, st.bytes, f, rng, now);
      s.wait_ends(now);
      s.wait_begins(now, false);
    }
    if (!r) break;
  }
  if (s.acks_due()) s.frame_acks();
  if (s.refusal()) s.frame_close();
  outcome o{l.lines, r, read_outbox(s.out()), s.counts(), s.buffered_bytes(), s.window_bytes(),
            s.credit_wanted(), l.entry_credit, l.tail_credit, l.landed, reasons};
  return o;
}

/// Runs `sc` every way: the same events, outbox and figures each time;
/// returns the whole-fed outcome.
outcome run_every_way(const scenario& sc) {
  const outcome first = run(sc, feeding::whole, 0);
  std::vector<std::pair<feeding, unsigned>> ways = {{feeding::bytewise, 0}, {feeding::landed, 0}};
  for (unsigned seed = 1; seed <= 5; ++seed) ways.emplace_back(feeding::random, seed);
  for (auto [f, seed] : ways) {
    BOOST_TEST_CONTEXT(name_of(f, seed)) {
      const outcome o = run(sc, f, seed);
      BOOST_TEST(o.lines == first.lines, boost::test_tools::per_element());
      BOOST_TEST(o.r.has_value() == first.r.has_value());
      if (!o.r && !first.r) BOOST_TEST(o.r.message() == first.r.message());
      BOOST_TEST((o.sent.acks == first.sent.acks));
      BOOST_TEST((o.sent.close == first.sent.close));
      BOOST_TEST(o.buffered == first.buffered);
      BOOST_TEST(o.window == first.window);
      BOOST_TEST(o.credit_wanted == first.credit_wanted);
      BOOST_TEST(o.counts.items_completed == first.counts.items_completed);
      BOOST_TEST((o.landed == first.landed));
    }
  }
  BOOST_TEST(first.sent.r.has_value(), "the outbox does not decode: " << first.sent.r.message());
  return first;
}

hello sender_hello(std::uint64_t features = 0, session_id session = NO_SESSION) {
  return hello{.role = wire_role::sender,
               .max_chunk_bytes = 128,
               .session = session,
               .features = features,
               .inline_bytes = 64};
}

consumer_session_options small_options() {
  consumer_session_options o;
  o.limits.window_bytes = 1 << 20;
  o.limits.max_chunk_bytes = 256;
  o.limits.inline_bytes = 100;
  return o;
}

consumer_session_options pooled_options() {
  auto o = small_options();
  o.pooled = true;
  return o;
}

/// Frames blob `id` with tag `t`: three entries (inline, chunked, empty)
/// and its tail, or an abort instead of the tail when `abort`.
void blob_frames(outbox& o, std::uint64_t id, const char* t, bool abort = false) {
  layout_builder b;
  entry(o, b, id, "small", bytes_value(pattern(40, unsigned(id))), 64, 128);
  entry(o, b, id, "large", bytes_value(pattern(1000, unsigned(id) + 7)), 64, 128);
  entry(o, b, id, "empty", bytes_value({}), 64, 128);
  if (abort) frame_blob_abort(o, id, "producer gave up");
  else tail(o, b, id, tag_of(t));
}

outbox hello_and(std::uint64_t features = 0, session_id session = NO_SESSION) {
  outbox o;
  frame_hello(o, sender_hello(features, session));
  return o;
}

}  // namespace

// ---- the handshake ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(answers_the_hello_with_the_negotiated_limits_and_features) {
  scenario sc{.opt = small_options()};
  sc.steps = {bytes(hello_and(feature_credit_grants | feature_entry_timestamps |
                              feature_blob_groups, session_of('s')))};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST_REQUIRE(o.sent.answer.has_value());
  const hello& a = *o.sent.answer;
  BOOST_TEST((a.role == wire_role::consumer));
  BOOST_TEST(a.max_chunk_bytes == 128u);  // the smaller of 128 and 256
  BOOST_TEST(a.inline_bytes == 64u);      // the smaller of 64 and 100
  BOOST_TEST(a.window_bytes == std::uint64_t{1} << 20);
  // Unpooled: credit grants are declined; timestamps are not accepted by
  // default; groups are.
  BOOST_TEST(a.features == feature_blob_groups);
  BOOST_TEST((a.session == session_of('s')));
  BOOST_TEST(o.lines.empty());
}

BOOST_AUTO_TEST_CASE(pooled_session_joins_the_pool_and_offers_its_initial_grant) {
  scenario sc{.opt = pooled_options(), .initial_grant = 12345};
  sc.steps = {bytes(hello_and(feature_credit_grants))};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST((o.lines == std::vector<std::string>{"join"}));
  BOOST_TEST(o.sent.answer->window_bytes == 12345u);
  BOOST_TEST((o.sent.answer->features & feature_credit_grants) != 0u);
  BOOST_TEST(o.window == 12345u);
}

BOOST_AUTO_TEST_CASE(pooled_session_refuses_a_sender_without_credit_grants) {
  scenario sc{.opt = pooled_options()};
  sc.steps = {bytes(hello_and(0))};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(!o.r.has_value());
  BOOST_TEST((o.r.code() == errc::protocol_violation));
  BOOST_TEST(o.r.message().find("feature_credit_grants") != std::string::npos, o.r.message());
  BOOST_TEST(o.lines.empty());  // never joined the pool
  BOOST_TEST(!o.sent.answer.has_value());
}

BOOST_AUTO_TEST_CASE(a_second_hello_is_refused) {
  scenario sc{.opt = small_options()};
  auto o1 = hello_and();
  frame_hello(o1, sender_hello());
  sc.steps = {bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(!o.r.has_value());
  BOOST_TEST((o.r.code() == errc::protocol_violation));
}

// ---- entries, blobs and credit back to the sender ---------------------------------

BOOST_AUTO_TEST_CASE(entries_and_blobs_reach_the_listener_alike_every_way) {
  scenario sc{.opt = small_options()};
  auto o1 = hello_and();
  frame_blob_begin(o1, 1, tag_of("a"));
  frame_blob_begin(o1, 2, tag_of("b"));
  blob_frames(o1, 1, "a");
  blob_frames(o1, 2, "b", true);
  frame_close(o1, "done");
  sc.steps = {bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  const std::vector<std::string> want = {
      "begin 1 a", "begin 2 b",
      "entry 1/0 small", "entry_complete 1/0", "entry 1/1 large", "entry_complete 1/1",
      "entry 1/2 empty", "entry_complete 1/2", "complete 1 rows=3",
      "entry 2/0 small", "entry_complete 2/0", "entry 2/1 large", "entry_complete 2/1",
      "entry 2/2 empty", "entry_complete 2/2", "abort 2 aborted producer gave up",
      "closed done"};
  BOOST_TEST(o.lines == want, boost::test_tools::per_element());
  const auto large = pattern(1000, 8);
  BOOST_TEST((o.landed.at({1, 1}) == std::vector<std::byte>(
                                         reinterpret_cast<const std::byte*>(large.data()),
                                         reinterpret_cast<const std::byte*>(large.data()) + 1000)));
  BOOST_TEST(o.counts.items_completed == 7u);  // six entries and one blob
}

BOOST_AUTO_TEST_CASE(released_credit_goes_back_in_one_ack_per_batch) {
  // A plain sender: no blob is acknowledged, and every byte of credit the
  // entries and the tail took comes back, in one ack frame.
  scenario sc{.opt = small_options()};
  auto o1 = hello_and();
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  sc.steps = {bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST_REQUIRE(o.sent.acks.size() == 1u);
  BOOST_TEST(o.sent.acks[0].second == 0u);
  BOOST_TEST(o.sent.ack_credit() == o.entry_credit + o.tail_credit);
  BOOST_TEST(o.buffered == 0u);
  BOOST_TEST(o.counts.acks_sent == 1u);
}

BOOST_AUTO_TEST_CASE(acks_become_due_once_until_framed) {
  sinks l;
  consumer_session s(small_options(), l);
  l.s = &s;
  auto o1 = hello_and();
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  BOOST_TEST_REQUIRE(s.consume(bytes_of(o1), t0).has_value());
  BOOST_TEST(l.acks_due_calls == 1);  // four releases, one wake-up
  BOOST_TEST(s.acks_due());
  s.frame_acks();
  BOOST_TEST(!s.acks_due());
  s.release(0);
  BOOST_TEST(!s.acks_due());  // nothing to return
  BOOST_TEST(l.acks_due_calls == 1);
}

BOOST_AUTO_TEST_CASE(entries_held_by_the_application_keep_their_credit) {
  scenario sc{.opt = small_options(), .hold = true};
  auto o1 = hello_and();
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  sc.steps = {bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST(o.buffered == o.entry_credit);
  BOOST_TEST(o.sent.ack_credit() == o.tail_credit);  // the tail's only
}

// ---- resend sessions: delivery, duplicates -----------------------------------------

BOOST_AUTO_TEST_CASE(resend_session_acks_each_blob_delivered_in_its_own_ack) {
  auto log = std::make_shared<tag_log>();
  scenario sc{.opt = small_options()};
  sc.opt.delivered = log;
  sc.opt.dedup_window = 77;
  auto o1 = hello_and(0, session_of('s'));
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  frame_blob_begin(o1, 2, tag_of("b"));
  blob_frames(o1, 2, "b", true);
  sc.steps = {call([log](consumer_session&, sinks&, time_point) { log->tags.clear(); }), bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST(o.sent.answer->dedup_window == 77u);
  // Completed and aborted by the producer: both final, each acknowledged in
  // an ack of its own (docs/wire.md "Delivery"), the first carrying the credit.
  BOOST_TEST_REQUIRE(o.sent.acks.size() == 2u);
  BOOST_TEST(o.sent.acks[0].second == 1u);
  BOOST_TEST(o.sent.acks[1].second == 2u);
  BOOST_TEST(o.sent.acks[1].first == 0u);
  BOOST_TEST(o.sent.ack_credit() == o.entry_credit + o.tail_credit);
  BOOST_TEST(log->contains(session_of('s'), tag_of("a")));
  BOOST_TEST(log->contains(session_of('s'), tag_of("b")));
}

BOOST_AUTO_TEST_CASE(resend_session_drops_a_duplicate_and_acks_it_at_once) {
  scenario sc{.opt = small_options()};
  auto log = std::make_shared<tag_log>();
  sc.opt.delivered = log;
  auto o1 = hello_and(0, session_of('s'));
  frame_blob_begin(o1, 1, tag_of("a"));
  auto o2 = outbox();
  blob_frames(o2, 1, "a");
  sc.steps = {call([log](consumer_session&, sinks&, time_point) {
                log->tags.clear();
                log->record(session_of('s'), tag_of("a"));
              }),
              bytes(o1),
              call([](consumer_session& s, sinks&, time_point) {
                // Acknowledged at blob_begin, before any entry of it.
                BOOST_TEST(s.acks_due());
              }),
              bytes(o2)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST((o.lines == std::vector<std::string>{"begin 1 a duplicate"}),
             boost::test_tools::per_element());
  BOOST_TEST(o.counts.duplicates_dropped == 1u);
  BOOST_TEST(o.sent.delivered() == std::vector<std::uint64_t>{1});  // once, not again at its tail
  // Its entries' and tail's credit all went back.
  BOOST_TEST(o.buffered == 0u);
  BOOST_TEST(o.sent.ack_credit() > o.entry_credit);
}

BOOST_AUTO_TEST_CASE(plain_sender_blob_is_never_a_duplicate) {
  scenario sc{.opt = small_options()};
  auto log = std::make_shared<tag_log>();
  log->record(NO_SESSION, tag_of("a"));
  sc.opt.delivered = log;
  auto o1 = hello_and();
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  sc.steps = {bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST(o.lines.front() == "begin 1 a");
  BOOST_TEST(o.counts.duplicates_dropped == 0u);
  BOOST_TEST(o.sent.delivered().empty());
}

BOOST_AUTO_TEST_CASE(blob_delivered_on_another_connection_meanwhile_is_voided) {
  auto log = std::make_shared<tag_log>();
  scenario sc{.opt = small_options()};
  sc.opt.delivered = log;
  auto o1 = hello_and(0, session_of('s'));
  frame_blob_begin(o1, 1, tag_of("a"));
  auto o2 = outbox();
  blob_frames(o2, 1, "a");
  sc.steps = {call([log](consumer_session&, sinks&, time_point) { log->tags.clear(); }), bytes(o1),
              call([log](consumer_session&, sinks&, time_point) { log->record(session_of('s'), tag_of("a")); }),
              bytes(o2)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST(o.lines.back() == "abort 1 aborted delivered on another connection of the session resend");
  BOOST_TEST(o.counts.duplicates_dropped == 1u);
  BOOST_TEST(o.sent.delivered() == std::vector<std::uint64_t>{1});
  BOOST_TEST(o.counts.items_completed == 3u);  // its entries; the blob is not delivered
}

BOOST_AUTO_TEST_CASE(a_blob_the_sink_failed_is_not_recorded_delivered) {
  // The sink reported it aborted: the sender resends it on its next
  // connection, so its tag must not be recorded.
  auto log = std::make_shared<tag_log>();
  scenario sc{.opt = small_options(), .fail_tails = true};
  sc.opt.delivered = log;
  auto o1 = hello_and(0, session_of('s'));
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  sc.steps = {call([log](consumer_session&, sinks&, time_point) { log->tags.clear(); }), bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST(o.lines.back() == "abort 1 io disk full");
  BOOST_TEST(!log->contains(session_of('s'), tag_of("a")));
  BOOST_TEST(o.sent.delivered().empty());
}

// consumer_session_listener: an error from blob_begin (the blob cannot be
// taken) or blob_complete (nor ended) ends the stream with that error; the
// blob is neither completed nor recorded delivered.
BOOST_AUTO_TEST_CASE(a_listener_error_at_blob_begin_or_blob_complete_ends_the_stream) {
  for (const bool at_begin : {true, false}) {
    BOOST_TEST_CONTEXT((at_begin ? "blob_begin" : "blob_complete")) {
      auto log = std::make_shared<tag_log>();
      scenario sc{.opt = small_options(), .refuse_begins = at_begin, .refuse_tails = !at_begin};
      sc.opt.delivered = log;
      auto o1 = hello_and(0, session_of('s'));
      frame_blob_begin(o1, 1, tag_of("a"));
      blob_frames(o1, 1, "a");
      sc.steps = {call([log](consumer_session&, sinks&, time_point) { log->tags.clear(); }),
                  bytes(o1)};
      const outcome o = run_every_way(sc);
      BOOST_TEST_REQUIRE(!o.r.has_value(), "the session accepted what its listener refused");
      BOOST_TEST((o.r.code() == errc::too_large), o.r.message());
      BOOST_TEST(o.r.message() ==
                     (at_begin ? "the sink refuses the blob" : "the sink refuses the tail"));
      for (const auto& line : o.lines) BOOST_TEST(!line.starts_with("complete"), line);
      BOOST_TEST(!log->contains(session_of('s'), tag_of("a")));
    }
  }
}

// ---- credit grants: requests, grants, the pool ---------------------------------------

BOOST_AUTO_TEST_CASE(a_request_the_unused_credit_covers_is_met_at_once) {
  scenario sc{.opt = pooled_options(), .initial_grant = 4096};
  auto o1 = hello_and(feature_credit_grants);
  frame_credit_request(o1, 4096);
  sc.steps = {bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  // Told to the pool all the same, but the sender waits for nothing.
  BOOST_TEST(o.lines.back() == "request 4096");
  BOOST_TEST(o.credit_wanted == 0u);
  BOOST_TEST(o.counts.credit_requests == 1u);
}

BOOST_AUTO_TEST_CASE(a_request_beyond_the_unused_credit_waits_until_covered) {
  scenario sc{.opt = pooled_options(), .initial_grant = 4096};
  auto o1 = hello_and(feature_credit_grants);
  frame_credit_request(o1, 5000);
  sc.steps = {bytes(o1), call([](consumer_session& s, sinks&, time_point now) {
                BOOST_TEST(s.credit_wanted() == 5000u);
                BOOST_TEST(!s.sender_has_credit());
                // 1000 granted: 4000 still wanted, but the window (5096) now
                // covers it, so the request is met.
                s.grant(1000, now);
                BOOST_TEST(s.credit_wanted() == 0u);
                BOOST_TEST(s.sender_has_credit());
              })};
  const outcome o = run_every_way(sc);
  BOOST_TEST(o.window == 5096u);
  // The grant reaches the sender in an ack.
  BOOST_TEST(o.sent.ack_credit() == 1000u);
}

BOOST_AUTO_TEST_CASE(a_grant_short_of_the_request_leaves_the_rest_wanted) {
  scenario sc{.opt = pooled_options(), .initial_grant = 4096};
  auto o1 = hello_and(feature_credit_grants);
  frame_credit_request(o1, 9000);
  sc.steps = {bytes(o1), call([](consumer_session& s, sinks&, time_point now) { s.grant(1000, now); })};
  const outcome o = run_every_way(sc);
  BOOST_TEST(o.credit_wanted == 8000u);  // 5096 of window does not cover it
}

BOOST_AUTO_TEST_CASE(pooled_session_hands_released_credit_to_the_pool_not_the_sender) {
  scenario sc{.opt = pooled_options(), .initial_grant = 1 << 20};
  auto o1 = hello_and(feature_credit_grants);
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  frame_blob_begin(o1, 2, tag_of("b"));
  sc.steps = {bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  // Each release goes to the pool as it happens, the tail's as soon as it
  // is checked, before the next frame is decoded, whatever the chunking
  // (run_every_way compares the lines).
  std::size_t releases = 0, complete_at = 0;
  for (std::size_t i = 0; i < o.lines.size(); ++i) {
    if (o.lines[i].starts_with("pool released")) ++releases;
    if (o.lines[i] == "complete 1 rows=3") complete_at = i;
  }
  BOOST_TEST(releases == 4u);  // three entries and the tail
  BOOST_TEST_REQUIRE(complete_at > 0u);
  BOOST_TEST(o.lines[complete_at - 1] == "pool released " + std::to_string(o.tail_credit));
  BOOST_TEST(o.lines.back() == "begin 2 b");
  BOOST_TEST(o.sent.acks.empty());
  // The window shrinks with each release: it is the pool's again.
  BOOST_TEST(o.window == (std::uint64_t{1} << 20) - o.entry_credit - o.tail_credit);
}

BOOST_AUTO_TEST_CASE(pooled_session_publishes_its_buffered_bytes) {
  sinks l;
  l.hold = true;
  l.initial_grant = 1 << 20;
  consumer_session s(pooled_options(), l);
  l.s = &s;
  auto o1 = hello_and(feature_credit_grants);
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  BOOST_TEST_REQUIRE(s.consume(bytes_of(o1), t0).has_value());
  const auto published = s.buffered_published();
  BOOST_TEST(published->load() == s.buffered_bytes());
  BOOST_TEST(s.buffered_bytes() == l.entry_credit);
  for (auto c : l.kept) s.release(c);
  BOOST_TEST(published->load() == 0u);
}

// ---- the held allowance -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(held_allowance_takes_yielded_entries_while_they_fit) {
  auto opt = small_options();
  opt.held_bytes = 1000;
  sinks l;
  consumer_session s(opt, l);
  l.s = &s;
  BOOST_TEST_REQUIRE(s.consume(bytes_of(hello_and()), t0).has_value());
  s.yielded(600);
  s.yielded(600);
  BOOST_TEST(s.held_in_window() == 1200u);
  BOOST_TEST(!s.sender_has_credit());  // the application holds part of the window
  BOOST_TEST(s.hold(600, t0));
  BOOST_TEST(s.held_credit() == 600u);
  BOOST_TEST(s.held_in_window() == 600u);
  BOOST_TEST(!s.hold(600, t0));  // 400 of room left
  BOOST_TEST(s.held_credit() == 600u);
  s.release_held(600, t0);
  BOOST_TEST(s.hold(600, t0));
  BOOST_TEST(s.held_in_window() == 0u);
  BOOST_TEST(s.counts().held_high_water == 600u);
  // Moved entries' credit went back to the sender.
  s.frame_acks();
  BOOST_TEST(read_outbox(s.out()).ack_credit() == 1200u);
}

BOOST_AUTO_TEST_CASE(one_entry_larger_than_the_allowance_moves_alone_only_by_default) {
  for (bool alone : {true, false}) {
    BOOST_TEST_CONTEXT("one_larger_alone " << alone) {
      auto opt = small_options();
      opt.held_bytes = 1000;
      opt.one_larger_alone = alone;
      sinks l;
      consumer_session s(opt, l);
      l.s = &s;
      BOOST_TEST_REQUIRE(s.consume(bytes_of(hello_and()), t0).has_value());
      s.yielded(5000);
      BOOST_TEST(s.hold(5000, t0) == alone);  // into an empty allowance
      s.yielded(10);
      BOOST_TEST(s.hold(10, t0) == !alone);   // never beside it
    }
  }
}

// ---- refusing the stream -------------------------------------------------------------

BOOST_AUTO_TEST_CASE(refusal_frames_a_close_with_its_reason_after_the_acks_end) {
  scenario sc{.opt = small_options()};
  auto o1 = hello_and();
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  sc.steps = {bytes(o1), call([](consumer_session& s, sinks&, time_point) {
                BOOST_TEST(s.refuse("entry over max_entry_bytes"));
                BOOST_TEST(!s.refuse("a second reason"));  // the first stands
                BOOST_TEST(!s.acks_due());                 // acks end with it
                s.release(100);
                BOOST_TEST(!s.acks_due());
              })};
  const outcome o = run_every_way(sc);
  BOOST_TEST((o.sent.close == std::optional<std::string>("entry over max_entry_bytes")));
  BOOST_TEST(o.sent.acks.empty());
}

BOOST_AUTO_TEST_CASE(stopped_acks_queue_nothing) {
  sinks l;
  consumer_session s(small_options(), l);
  l.s = &s;
  BOOST_TEST_REQUIRE(s.consume(bytes_of(hello_and()), t0).has_value());
  s.stop_acks();
  s.release(100);
  BOOST_TEST(!s.acks_due());
  BOOST_TEST(l.acks_due_calls == 0);
  BOOST_TEST(!s.refusal().has_value());
}

BOOST_AUTO_TEST_CASE(a_refused_frame_fails_the_same_way_every_way) {
  // A limit of the decoder's, reached through the session: the same
  // refusal at the same frame, whatever the chunking.
  scenario sc{.opt = small_options()};
  sc.opt.limits.max_entry_bytes = 500;
  auto o1 = hello_and();
  frame_blob_begin(o1, 1, tag_of("a"));
  blob_frames(o1, 1, "a");
  sc.steps = {bytes(o1)};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(!o.r.has_value());
  BOOST_TEST((o.r.code() == errc::protocol_violation));
  BOOST_TEST(o.r.message().find("max_entry_bytes") != std::string::npos, o.r.message());
  BOOST_TEST(o.lines.back() == "entry_complete 1/0");
}

// ---- the clocks: time fed in, the caller's timer calls on_time() ---------------------

namespace {

consumer_session_options clocked(ms stall, ms idle = ms(0), ms held = ms(0)) {
  auto o = small_options();
  o.stall_timeout = stall;
  o.idle_timeout = idle;
  o.held_timeout = held;
  return o;
}

/// hello, blob 1 begun, and entry 0 ("big", `len` bytes) announced with
/// its first `first` bytes sent.
outbox entry_half_sent(std::size_t len, std::size_t first, std::vector<std::uint8_t>& bytes_out) {
  outbox o = hello_and();
  frame_blob_begin(o, 1, tag_of("a"));
  layout_builder b;
  bytes_out = pattern(len, 3);
  const planned_entry& pe = *b.add("big", bytes_value(bytes_out)).value();
  frame_entry_begin(o, 1, 0, pe.entry, pe.entry.meta());
  frame_data(o, 1, 0, std::span(pe.source.data, first), 128, true);
  return o;
}

/// The rest of that entry: bytes [from, to) of it.
outbox entry_rest(const std::vector<std::uint8_t>& v, std::size_t from, std::size_t to) {
  outbox o;
  frame_data(o, 1, from, std::as_bytes(std::span(v)).subspan(from, to - from), 128, true);
  return o;
}

bool has(const std::vector<std::string>& v, const std::string& what) {
  for (const auto& s : v)
    if (s.find(what) != std::string::npos) return true;
  return false;
}

}  // namespace

BOOST_AUTO_TEST_CASE(stall_ends_a_sender_that_owes_an_entry_and_makes_no_progress) {
  std::vector<std::uint8_t> v;
  scenario sc{.opt = clocked(ms(100))};
  sc.steps = {bytes(entry_half_sent(4000, 1000, v)), timer(ms(99)), timer(ms(100))};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST(o.lines.back() == "expired stall");
  BOOST_TEST_REQUIRE(o.reasons.size() == 1u);  // not at 99 ms
  BOOST_TEST(has(o.reasons, "(stall_timeout"), o.reasons[0]);
}

BOOST_AUTO_TEST_CASE(a_trickle_is_no_progress_but_an_entry_completed_is) {
  std::vector<std::uint8_t> v;
  scenario sc{.opt = clocked(ms(100))};
  sc.steps = {bytes(entry_half_sent(4000, 1000, v)),
              bytes(entry_rest(v, 1000, 2000), ms(60)),  // bytes, fewer than 1 MiB
              timer(ms(100)),                            // stalled all the same
              call([](consumer_session&, sinks& l, time_point) { l.lines.push_back("--"); },
                   ms(100))};
  const outcome o = run_every_way(sc);
  BOOST_TEST(o.lines.back() == "--");
  BOOST_TEST(o.lines[o.lines.size() - 2] == "expired stall");

  scenario done{.opt = clocked(ms(100))};
  done.steps = {bytes(entry_half_sent(4000, 1000, v)),
                bytes(entry_rest(v, 1000, 4000), ms(60)),  // the entry completes
                timer(ms(159)), timer(ms(160))};           // owed still: its blob is open
  const outcome p = run_every_way(done);
  BOOST_TEST_REQUIRE(p.reasons.size() == 1u);
  BOOST_TEST(p.lines.back() == "expired stall");
}

BOOST_AUTO_TEST_CASE(a_mebibyte_of_admitted_bytes_is_progress) {
  std::vector<std::uint8_t> v;
  const std::size_t mib = std::size_t{1} << 20;
  scenario sc{.opt = clocked(ms(100))};
  sc.steps = {bytes(entry_half_sent(3 * mib, 1000, v)),
              bytes(entry_rest(v, 1000, 1000 + mib), ms(60)),  // 1 MiB more
              timer(ms(159)), timer(ms(160))};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.reasons.size() == 1u);  // at 160, not at 100
  BOOST_TEST(o.lines.back() == "expired stall");
}

BOOST_AUTO_TEST_CASE(blob_begin_and_abort_pairs_are_no_progress) {
  // Blob 1 stays open while the sender holds credit: it owes bytes. Pairs
  // of blob_begin + blob_abort every 30 ms keep nothing alive.
  scenario sc{.opt = clocked(ms(100))};
  auto o1 = hello_and();
  frame_blob_begin(o1, 1, tag_of("a"));
  sc.steps = {bytes(o1)};
  for (std::uint64_t id = 2; id <= 4; ++id) {
    outbox pair;
    frame_blob_begin(pair, id, tag_of("p"));
    frame_blob_abort(pair, id, std::string(4096, 'x'));
    sc.steps.push_back(bytes(pair, ms(30 * (id - 1))));
  }
  sc.steps.push_back(timer(ms(100)));
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.r.has_value(), o.r.message());
  BOOST_TEST(o.lines.back() == "expired stall");
}

BOOST_AUTO_TEST_CASE(the_hello_is_owed_from_the_start) {
  scenario sc{.opt = clocked(ms(100))};
  sc.steps = {timer(ms(100))};
  const outcome o = run_every_way(sc);
  BOOST_TEST((o.lines == std::vector<std::string>{"expired stall"}));
}

BOOST_AUTO_TEST_CASE(a_sender_owing_nothing_is_not_stalled_but_idle_ends_its_silence) {
  scenario sc{.opt = clocked(ms(100), ms(300))};
  sc.steps = {bytes(hello_and()), timer(ms(299)), bytes(outbox(), ms(0)), timer(ms(300))};
  // Owing nothing (no blob open): only the idle clock runs.
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.reasons.size() == 1u);
  BOOST_TEST(o.lines.back() == "expired idle");
  BOOST_TEST(has(o.reasons, "(idle_timeout)"), o.reasons[0]);

  // Any bytes end a silence.
  scenario again{.opt = clocked(ms(0), ms(100))};
  auto o1 = hello_and();
  auto o2 = outbox();
  frame_blob_begin(o2, 1, tag_of("a"));
  again.steps = {bytes(o1), bytes(o2, ms(80)), timer(ms(179)), timer(ms(180))};
  const outcome p = run_every_way(again);
  BOOST_TEST_REQUIRE(p.reasons.size() == 1u);
  BOOST_TEST(p.lines.back() == "expired idle");
}

BOOST_AUTO_TEST_CASE(a_covered_credit_request_leaves_the_stall_clock_running) {
  // The initial grant covers the request: the sender waits for nothing,
  // holds a blob open, and is stalled.
  scenario sc{.opt = pooled_options(), .initial_grant = 4096};
  sc.opt.stall_timeout = ms(100);
  auto o1 = hello_and(feature_credit_grants);
  frame_blob_begin(o1, 1, tag_of("a"));
  frame_credit_request(o1, 4096);
  sc.steps = {bytes(o1), timer(ms(100))};
  const outcome o = run_every_way(sc);
  BOOST_TEST(o.lines.back() == "expired stall");
}

BOOST_AUTO_TEST_CASE(a_request_waiting_for_credit_stops_the_stall_clock_until_met) {
  scenario sc{.opt = pooled_options(), .initial_grant = 4096};
  sc.opt.stall_timeout = ms(100);
  auto o1 = hello_and(feature_credit_grants);
  frame_blob_begin(o1, 1, tag_of("a"));
  frame_credit_request(o1, 5000);
  sc.steps = {bytes(o1), timer(ms(1000)),
              // 1000 granted: 4000 still wanted, but the window covers it: the
              // request is met and the clock runs from the grant.
              call([](consumer_session& s, sinks&, time_point now) { s.grant(1000, now); },
                   ms(1000)),
              timer(ms(1099)), timer(ms(1100))};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.reasons.size() == 1u);
  BOOST_TEST(o.lines.back() == "expired stall");
}

BOOST_AUTO_TEST_CASE(credit_pressure_adds_up_and_ends_the_holder) {
  scenario sc{.opt = pooled_options(), .initial_grant = 1 << 20};
  sc.opt.stall_timeout = ms(100);
  sc.steps = {bytes(hello_and(feature_credit_grants)),
              call([](consumer_session&, sinks& l, time_point) { l.pressed = true; }),
              timer(ms(50)), timer(ms(100)), timer(ms(149)), timer(ms(150))};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.reasons.size() == 1u);  // 100 ms pressed counted from the first sight
  BOOST_TEST(o.lines.back() == "expired pressed");
  BOOST_TEST(has(o.reasons, "unused credit that other connections wait for"), o.reasons[0]);
  BOOST_TEST(has(o.reasons, "(stall_timeout)"), o.reasons[0]);
}

BOOST_AUTO_TEST_CASE(holding_the_window_past_held_timeout_names_it) {
  auto opt = clocked(ms(0), ms(0), ms(100));
  opt.held_bytes = 0;
  scenario sc{.opt = opt};
  sc.steps = {bytes(hello_and()),
              // An entry yielded; the application calls next() again.
              call([](consumer_session& s, sinks&, time_point now) {
                s.yielded(500);
                s.wait_ends(now);
                s.wait_begins(now, false);
              }),
              timer(ms(99)), timer(ms(100))};
  const outcome o = run_every_way(sc);
  BOOST_TEST_REQUIRE(o.reasons.size() == 1u);
  BOOST_TEST(o.lines.back() == "expired held");
  BOOST_TEST(has(o.reasons, "(held_timeout)"), o.reasons[0]);

  // With waits reported, holding counts only once the application waits.
  opt.waits_reported = true;
  scenario w{.opt = opt};
  w.steps = {bytes(hello_and()),
             // An entry yielded; the application calls next() again.
              call([](consumer_session& s, sinks&, time_point now) {
                s.yielded(500);
                s.wait_ends(now);
                s.wait_begins(now, false);
              }),
             timer(ms(500)),
             call([](consumer_session& s, sinks&, time_point now) { s.application_waits(now); },
                  ms(500)),
             timer(ms(599)), timer(ms(600))};
  const outcome p = run_every_way(w);
  BOOST_TEST_REQUIRE(p.reasons.size() == 1u);
  BOOST_TEST(p.lines.back() == "expired held");
}

BOOST_AUTO_TEST_CASE(time_not_waiting_is_not_the_senders) {
  sinks l;
  consumer_session s(clocked(ms(100)), l);
  l.s = &s;
  std::vector<std::uint8_t> v;
  s.wait_begins(t0, false);
  BOOST_TEST_REQUIRE(s.consume(bytes_of(entry_half_sent(4000, 1000, v)), t0).has_value());
  s.wait_ends(t0 + ms(50));
  BOOST_TEST(!s.on_time(t0 + ms(5000)).has_value());  // no wait open
  s.wait_begins(t0 + ms(5000), false);
  BOOST_TEST(!s.on_time(t0 + ms(5049)).has_value());
  const auto e = s.on_time(t0 + ms(5050));  // 50 ms before, 50 ms after
  BOOST_TEST_REQUIRE(e.has_value());
  BOOST_TEST((e->which == clock_expiry::limit::stall));
}

BOOST_AUTO_TEST_CASE(the_timer_is_asked_a_quarter_of_the_shortest_limit_on_and_stops) {
  sinks l;
  consumer_session none(small_options(), l);
  BOOST_TEST(!none.next_deadline(t0).has_value());  // no limit: no timer
  consumer_session s(clocked(ms(400), ms(1000), ms(200)), l);
  l.s = &s;
  BOOST_TEST_REQUIRE(s.next_deadline(t0).has_value());
  BOOST_TEST((*s.next_deadline(t0) == t0 + ms(50)));
  s.wait_begins(t0, false);
  s.stop_clocks();
  BOOST_TEST(!s.next_deadline(t0).has_value());
  BOOST_TEST(!s.on_time(t0 + ms(10000)).has_value());
}
