// The push decoder (blobpipe/protocol/decoder.hpp), driven with bytes and no
// socket, as Arrow's IPC tests drive its MessageDecoder: every stream is fed
// whole, one byte at a time, in seeded random chunkings, and through
// payload_target()/commit_payload() (a message transport's path), and every
// way must report the same events, land the same bytes, and refuse at the
// same frame with the same message. Each refusal of docs/wire.md ("Limits",
// "Consumer") and of decoder_limits has a case that asserts which refusal
// it is: protocol_violation and the field or limit its message names.
#define BOOST_TEST_MODULE decoder_test
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "test/wire_vectors.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;
using namespace blobpipe::testing::vectors_detail;

namespace {

const hello sender_hello{.role = wire_role::sender};

/// Appends one frame with `h` (its length set from `p`) and payload `p`.
void raw(outbox& o, frame_header h, std::span<const std::byte> p = {}) {
  h.length = static_cast<std::uint32_t>(p.size());
  auto room = o.append(frame_header_size + p.size());
  encode_frame_header(h, room);
  if (!p.empty()) std::memcpy(room.data() + frame_header_size, p.data(), p.size());
}

/// `n` bytes, distinct per `seed` (entry and blob), never all one value.
std::vector<std::uint8_t> pattern(std::size_t n, unsigned seed) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>(seed * 31 + i * 7 + (i >> 8));
  return v;
}

value bytes_value(const std::vector<std::uint8_t>& v) {
  return value::ndarray_bytes(std::as_bytes(std::span(v)), "|u1", {static_cast<std::int64_t>(v.size())});
}

/// Records every event as a line, lands each entry in a buffer of its own
/// pre-filled with 0xEE (so a byte never landed shows), counts each entry's
/// completions, and drops entries (releases their credit) on completion
/// unless `hold`.
class recorder : public decoder_listener {
 public:
  decoder* dec = nullptr;
  bool hold = false;
  std::vector<std::string> lines;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::byte>> landed;
  std::map<std::pair<std::uint64_t, std::uint64_t>, int> completions;
  std::vector<std::string> wrong;  // listener contract broken by the decoder
  std::map<std::uint64_t, std::vector<Entry>> rows;  // blob_complete's index rows

  result<void> on_hello(const hello& h) override {
    lines.push_back("hello role=" + std::to_string(static_cast<int>(h.role)));
    return {};
  }
  result<void*> on_blob_begin(std::uint64_t id, const tag_t& tag) override {
    lines.push_back("blob_begin " + std::to_string(id) + " " + hex(tag));
    return user_of(id);
  }
  result<std::span<std::byte>> on_entry_begin(void* blob, const entry_announcement& a) override {
    if (blob != user_of(a.blob_id)) wrong.push_back("entry_begin: not the blob's pointer");
    lines.push_back("entry_begin " + std::to_string(a.blob_id) + "/" + std::to_string(a.index) +
                    " " + a.entry->key + " len=" + std::to_string(a.entry->len) +
                    " credit=" + std::to_string(a.credit));
    current_[a.blob_id] = {a.index, a.credit};
    auto& buf = landed[{a.blob_id, a.index}];
    buf.assign(a.entry->len, std::byte{0xEE});
    return std::span<std::byte>(buf);
  }
  result<void> on_entry_complete(void* blob, std::uint64_t id) override {
    if (blob != user_of(id)) wrong.push_back("entry_complete: not the blob's pointer");
    const auto [index, credit] = current_.at(id);
    lines.push_back("entry_complete " + std::to_string(id) + "/" + std::to_string(index));
    if (++completions[{id, index}] != 1) wrong.push_back("an entry completed twice");
    if (!hold) dec->release(credit);
    return {};
  }
  result<void> on_blob_complete(void* blob, std::uint64_t id, blob_index index,
                                std::span<const std::byte> tail) override {
    if (blob != user_of(id)) wrong.push_back("blob_complete: not the blob's pointer");
    lines.push_back("blob_complete " + std::to_string(id) + " rows=" +
                    std::to_string(index.entries.size()) + " nbytes=" +
                    std::to_string(index.nbytes) + " tail=" + std::to_string(tail.size()));
    rows[id] = std::move(index.entries);
    return {};
  }
  result<void> on_blob_abort(void* blob, std::uint64_t id, std::string_view reason) override {
    if (blob != user_of(id)) wrong.push_back("blob_abort: not the blob's pointer");
    lines.push_back("blob_abort " + std::to_string(id) + " " + std::string(reason));
    return {};
  }
  result<void> on_blob_group(void*, std::uint64_t id, const blob_group& g) override {
    lines.push_back("blob_group " + std::to_string(id) + " group=" + std::to_string(g.id) + "/" +
                    std::to_string(g.size));
    return {};
  }
  result<void> on_ack(std::uint64_t credit, std::uint64_t id) override {
    lines.push_back("ack " + std::to_string(credit) + " " + std::to_string(id));
    return {};
  }
  result<void> on_credit_request(std::uint64_t credit) override {
    lines.push_back("credit_request " + std::to_string(credit));
    return {};
  }
  result<void> on_close(std::string_view reason) override {
    lines.push_back("close " + std::string(reason));
    return {};
  }

 private:
  static void* user_of(std::uint64_t id) {
    return reinterpret_cast<void*>(static_cast<std::uintptr_t>(id * 16 + 8));
  }
  std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> current_;
};

/// How a stream reaches the decoder.
/// `turns`: consume_some() with a budget of 1 to 3 frames' work
/// (decoder::frame_work_floor_bytes) per call, the work reset each time, as
/// the consumer's turns feed it (docs/cluster.md "Fair turns").
enum class feeding { whole, bytewise, random, landed, turns };

struct decoded {
  std::vector<std::string> lines;
  result<void> r;
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::byte>> landed;
  std::vector<std::string> wrong;
  std::uint64_t buffered = 0;
  bool closed = false;
  std::size_t open_blobs = 0;
  std::map<std::uint64_t, std::vector<Entry>> rows;
  std::uint64_t admitted = 0;  // decoder::admitted_bytes() at the end
};

std::string name_of(feeding f, unsigned seed) {
  switch (f) {
    case feeding::whole: return "whole";
    case feeding::bytewise: return "one byte at a time";
    case feeding::random: return "random chunks, seed " + std::to_string(seed);
    case feeding::landed: return "payloads landed with payload_target/commit_payload";
    case feeding::turns: return "turns of " + std::to_string(seed) + " frames' work";
  }
  return "?";
}

decoded decode(std::span<const std::byte> s, decoder_limits lim, feeding f, unsigned seed = 0,
               wire_role from = wire_role::sender, bool hold = false) {
  recorder l;
  l.hold = hold;
  decoder d(from, lim, l);
  l.dec = &d;
  result<void> r;
  std::mt19937 rng(seed);
  std::size_t at = 0;
  while (at < s.size() && r) {
    const std::size_t left = s.size() - at;
    std::size_t n = left;
    switch (f) {
      case feeding::whole: break;
      case feeding::bytewise: n = 1; break;
      case feeding::random:
        // Mostly small pieces (headers split anywhere), sometimes large.
        n = rng() % 4 == 0 ? 1 + rng() % left : 1 + rng() % std::min<std::size_t>(left, 40);
        break;
      case feeding::landed:
        if (d.in_payload()) {
          n = static_cast<std::size_t>(std::min<std::uint64_t>(d.payload_remaining(), left));
          auto target = d.payload_target();
          BOOST_TEST_REQUIRE(target.size() == d.payload_remaining());
          std::memcpy(target.data(), s.data() + at, n);
          r = d.commit_payload(n);
          at += n;
          continue;
        }
        n = std::min(std::max<std::size_t>(d.next_required_size(), 1), left);
        break;
      case feeding::turns: {
        d.reset_work();
        auto took = d.consume_some(s.subspan(at), decoder::frame_work_floor_bytes * seed);
        if (!took) {
          r = took.err();
          continue;
        }
        BOOST_TEST_REQUIRE(*took > 0u, "a turn took no byte");
        at += *took;
        continue;
      }
    }
    r = d.consume(s.subspan(at, n));
    at += n;
  }
  decoded out{l.lines,          r,          l.landed,        l.wrong,
              d.buffered_bytes(), d.closed(), d.open_blobs(), l.rows,
              d.admitted_bytes()};
  if (!r) {
    // After a failure every call returns the same error, and nothing more is asked for.
    const std::byte one{0};
    auto again = d.consume(std::span(&one, 1));
    BOOST_TEST(!again);
    if (!again) BOOST_TEST(again.message() == r.message());
    BOOST_TEST(d.next_required_size() == 0u);
  }
  return out;
}

/// Every way of feeding `s`, with the seeds used for random chunkings.
std::vector<std::pair<feeding, unsigned>> feedings() {
  std::vector<std::pair<feeding, unsigned>> v = {
      {feeding::whole, 0}, {feeding::bytewise, 0}, {feeding::landed, 0}};
  for (unsigned seed = 1; seed <= 6; ++seed) v.emplace_back(feeding::random, seed);
  for (unsigned frames = 1; frames <= 3; ++frames) v.emplace_back(feeding::turns, frames);
  return v;
}

/// Whether two refusals are the same. A stray client's names the bytes seen
/// when it was refused, which depend on the chunking; every other message
/// is the same whatever the chunking.
bool same_refusal(const std::string& a, const std::string& b) {
  const std::string stray = "the first bytes are not a blobpipe hello";
  if (a.starts_with(stray) && b.starts_with(stray)) return true;
  return a == b;
}

/// Decodes `s` every way: the same events each time; returns the whole-fed result.
decoded decode_every_way(std::span<const std::byte> s, decoder_limits lim = {},
                         wire_role from = wire_role::sender, bool hold = false) {
  const decoded first = decode(s, lim, feeding::whole, 0, from, hold);
  for (auto [f, seed] : feedings()) {
    BOOST_TEST_CONTEXT(name_of(f, seed)) {
      const decoded d = decode(s, lim, f, seed, from, hold);
      BOOST_TEST(d.lines == first.lines, boost::test_tools::per_element());
      BOOST_TEST(d.r.has_value() == first.r.has_value());
      if (!d.r && !first.r) BOOST_TEST(same_refusal(d.r.message(), first.r.message()));
      BOOST_TEST(d.wrong.empty(), (d.wrong.empty() ? "" : d.wrong.front()));
      BOOST_TEST((d.landed == first.landed));
      BOOST_TEST(d.admitted == first.admitted);
    }
  }
  return first;
}

/// `s` is refused, every way it is fed, with protocol_violation and a
/// message naming `what`; the events before the refusal are the same.
decoded expect_refused(std::span<const std::byte> s, const std::string& what,
                       decoder_limits lim = {}, wire_role from = wire_role::sender) {
  decoded d = decode_every_way(s, lim, from);
  BOOST_TEST_REQUIRE(!d.r, "accepted; expected a refusal naming: " << what);
  BOOST_TEST((d.r.code() == errc::protocol_violation), d.r.message());
  BOOST_TEST(d.r.message().find(what) != std::string::npos,
             "refused with \"" << d.r.message() << "\", expected one naming \"" << what << "\"");
  return d;
}

/// hello + blob_begin(id 1).
outbox begun(std::uint64_t id = 1, const tag_t& tag = tag_of("t")) {
  outbox o;
  frame_hello(o, sender_hello);
  frame_blob_begin(o, id, tag);
  return o;
}

Entry f32_entry(std::string key, std::uint64_t off, std::int64_t n) {
  Entry e;
  e.key = std::move(key);
  e.off = off;
  e.len = static_cast<std::uint64_t>(n) * 4;
  e.kind = 't';
  e.dtype = "float32";
  e.shape = shape_t{n};
  return e;
}

/// entry_begin for `e` as entry `index` of blob `id` (no inline bytes).
void begin_entry(outbox& o, std::uint64_t id, std::uint64_t index, const Entry& e) {
  raw(o, {.type = frame_type::entry_begin, .blob_id = id, .arg = index},
      encode_entry_begin(e.key, e.meta()));
}

std::vector<std::byte> tail_of(layout_builder& b, const tag_t& tag) {
  auto plan = b.finish(tag).value();
  std::vector<std::byte> t(tail_size(plan));
  (void)write_tail(plan, t);
  return t;
}

}  // namespace

// ---- valid streams ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(every_chunking_decodes_the_vectors_alike) {
  for (const auto& v : build_vectors()) {
    BOOST_TEST_CONTEXT(v.name) {
      // The consumer's defaults, negotiated as vector_listener does.
      decoder_limits lim;
      lim.max_chunk_bytes = 128;
      lim.inline_bytes = 64;
      (void)decode_every_way(v.bytes, lim);
    }
  }
}

BOOST_AUTO_TEST_CASE(entries_land_byte_for_byte_in_their_own_buffers) {
  // Three blobs interleaved, entries of distinct bytes (inline, one chunk,
  // many chunks, empty): each lands exactly its own bytes, each completes
  // once, each blob completes with its rows.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::vector<std::uint8_t>> sent;
  outbox o;
  frame_hello(o, sender_hello);
  std::vector<layout_builder> b(3);
  std::vector<tag_t> tags;
  for (std::uint64_t id = 1; id <= 3; ++id) {
    tags.push_back(tag_of(("blob " + std::to_string(id)).c_str()));
    frame_blob_begin(o, id, tags.back());
  }
  const std::size_t sizes[] = {40, 200, 1000, 0};
  for (std::uint64_t k = 0; k < 4; ++k) {
    for (std::uint64_t id = 1; id <= 3; ++id) {
      sent[{id, k}] = pattern(sizes[k], static_cast<unsigned>(id * 10 + k));
      entry(o, b[id - 1], id, "e" + std::to_string(k), bytes_value(sent[{id, k}]), 64, 128);
    }
  }
  std::uint64_t tail_bytes = 0;
  for (std::uint64_t id = 1; id <= 3; ++id) {
    const auto t = tail_of(b[id - 1], tags[id - 1]);
    tail_bytes += t.size();
    frame_tail(o, id, t);
  }
  frame_close(o, "done");
  decoder_limits lim;
  lim.max_chunk_bytes = 128;
  lim.inline_bytes = 64;
  const auto d = decode_every_way(bytes_of(o), lim);
  BOOST_TEST_REQUIRE(d.r.has_value(), d.r.message());
  // Progress counts every entry byte (inline or in data frames) and every
  // tail byte, nothing else.
  BOOST_TEST(d.admitted == 3 * (40 + 200 + 1000) + tail_bytes);
  BOOST_TEST(d.closed);
  BOOST_TEST(d.open_blobs == 0u);
  BOOST_TEST(d.buffered == 0u);  // every entry dropped, every tail released
  BOOST_TEST_REQUIRE(d.landed.size() == sent.size());
  for (const auto& [key, bytes] : sent) {
    BOOST_TEST_CONTEXT("blob " << key.first << " entry " << key.second) {
      const auto& got = d.landed.at(key);
      BOOST_TEST_REQUIRE(got.size() == bytes.size());
      // (memcmp of an empty entry would pass null pointers: UBSan.)
      BOOST_TEST((bytes.empty() || std::memcmp(got.data(), bytes.data(), bytes.size()) == 0));
    }
  }
  std::size_t completes = 0;
  for (const auto& line : d.lines) completes += line.starts_with("blob_complete");
  BOOST_TEST(completes == 3u);
}

// ---- decoder_limits ---------------------------------------------------------------

BOOST_AUTO_TEST_CASE(max_open_blobs_refuses_one_more_blob_begun) {
  decoder_limits lim;
  lim.max_open_blobs = 2;
  // hello, blobs 1 and 2; then `more`.
  const auto two_open = [](const std::function<void(outbox&)>& more) {
    outbox o;
    frame_hello(o, sender_hello);
    frame_blob_begin(o, 1, tag_of("a"));
    frame_blob_begin(o, 2, tag_of("b"));
    more(o);
    return bytes_of(o);
  };
  {  // Two open: admitted. One ends (aborted): a third may begin.
    const auto d = decode_every_way(two_open([](outbox& o) {
                                      frame_blob_abort(o, 1, "gone");
                                      frame_blob_begin(o, 3, tag_of("c"));
                                    }),
                                    lim);
    BOOST_TEST(d.r.has_value(), d.r.message());
    BOOST_TEST(d.open_blobs == 2u);
  }
  const auto d = expect_refused(
      two_open([](outbox& o) { frame_blob_begin(o, 3, tag_of("c")); }),
      "blob_begin: more than max_open_blobs (2) blobs open", lim);
  BOOST_TEST(d.lines.size() == 3u);  // hello and the two blobs admitted
}

BOOST_AUTO_TEST_CASE(max_entries_per_blob_refuses_one_more_entry) {
  decoder_limits lim;
  lim.max_entries_per_blob = 3;
  const tag_t tag = tag_of("entries");
  // `n` entries, then the tail when `end`.
  const auto entries = [&](int n, bool end) {
    outbox o = begun(1, tag);
    layout_builder b;
    const auto x = pattern(8, 1);
    for (int k = 0; k < n; ++k) entry(o, b, 1, "e" + std::to_string(k), bytes_value(x), 64, 128);
    if (end) tail(o, b, 1, tag);
    return bytes_of(o);
  };
  {  // Exactly the limit: the blob completes.
    const auto d = decode_every_way(entries(3, true), lim);
    BOOST_TEST(d.r.has_value(), d.r.message());
    BOOST_TEST(d.lines.back().starts_with("blob_complete 1 rows=3"), d.lines.back());
  }
  expect_refused(entries(4, false), "entry_begin: more than max_entries_per_blob entries", lim);
}

BOOST_AUTO_TEST_CASE(max_entry_bytes_refuses_an_entry_one_byte_longer) {
  decoder_limits lim;
  lim.max_entry_bytes = 100;
  for (const std::size_t n : {std::size_t{100}, std::size_t{101}}) {
    BOOST_TEST_CONTEXT(n << " bytes") {
      outbox o = begun();
      layout_builder b;
      entry(o, b, 1, "x", bytes_value(pattern(n, 2)), 0, 64);  // data frames
      if (n <= 100) {
        const auto d = decode_every_way(bytes_of(o), lim);
        BOOST_TEST(d.r.has_value(), d.r.message());
        BOOST_TEST(d.landed.at({1, 0}).size() == n);
      } else {
        expect_refused(bytes_of(o), "101 bytes exceed max_entry_bytes 100", lim);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(max_blob_bytes_refuses_an_entry_or_tail_past_it) {
  {  // The entry itself ends past max_blob_bytes.
    decoder_limits lim;
    lim.max_blob_bytes = 256;
    outbox o = begun();
    layout_builder b;
    entry(o, b, 1, "x", bytes_value(pattern(300, 3)), 0, 1024);
    expect_refused(bytes_of(o), "entry 'x': bytes [0, +300) run past the data region end 256", lim);
  }
  {  // The entries fit; with the tail the blob would not.
    const tag_t tag = tag_of("t");
    outbox o = begun(1, tag);
    layout_builder b;
    entry(o, b, 1, "x", bytes_value(pattern(200, 3)), 0, 1024);
    const auto t = tail_of(b, tag);
    frame_tail(o, 1, t);
    decoder_limits lim;
    lim.max_blob_bytes = 256 + t.size() - 1;
    expect_refused(bytes_of(o), "tail: blob would exceed max_blob_bytes", lim);
    lim.max_blob_bytes = 256 + t.size();
    BOOST_TEST(decode_every_way(bytes_of(o), lim).r.has_value());
  }
}

BOOST_AUTO_TEST_CASE(max_tail_bytes_and_max_chunk_bytes_and_max_key_bytes_are_named) {
  {
    decoder_limits lim;
    lim.max_tail_bytes = 4096;
    outbox o = begun();
    raw(o, {.type = frame_type::tail, .blob_id = 1}, std::vector<std::byte>(8192));
    expect_refused(bytes_of(o), "tail: 8192 bytes not in [33, 4096]", lim);
  }
  {
    decoder_limits lim;
    lim.max_chunk_bytes = 1024;
    outbox o = begun();
    begin_entry(o, 1, 0, f32_entry("x", 0, 1024));
    raw(o, {.type = frame_type::data, .blob_id = 1, .arg = 0}, std::vector<std::byte>(2048));
    expect_refused(bytes_of(o), "data: chunk of 2048 bytes not in [1, 1024]", lim);
  }
  {
    decoder_limits lim;
    lim.max_key_bytes = 16;
    outbox o = begun();
    begin_entry(o, 1, 0, f32_entry(std::string(100, 'k'), 0, 1));
    expect_refused(bytes_of(o), "key length 100 exceeds max_key_bytes 16", lim);
  }
  {
    decoder_limits lim;
    lim.max_frame_bytes = 1000;
    outbox o = begun();
    raw(o, {.type = frame_type::blob_abort, .blob_id = 1}, std::vector<std::byte>(1001));
    expect_refused(bytes_of(o), "blob_abort length 1001", lim);
  }
}

// ---- the tail ------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(tail_longer_than_an_index_of_the_announced_entries_is_refused_at_its_header) {
  // docs/wire.md "Limits": a tail is bounded by the rows announced before a
  // byte of it is buffered. The bound is the one the message names: a tail
  // of exactly that many bytes passes the header (and fails later, on its
  // footer), one byte more is refused at the header.
  const tag_t tag = tag_of("bounded");
  outbox o = begun(1, tag);
  layout_builder b;
  entry(o, b, 1, "x", bytes_value(pattern(16, 4)), 64, 128);
  const auto prefix = bytes_of(o);
  const auto with_tail = [&](std::size_t n) {
    outbox t;
    raw(t, {.type = frame_type::tail, .blob_id = 1}, std::vector<std::byte>(n, std::byte{0x11}));
    auto s = prefix;
    const auto more = bytes_of(t);
    s.insert(s.end(), more.begin(), more.end());
    return s;
  };
  const auto d = expect_refused(with_tail(4000), "more than an index of the 1 entries announced can take");
  // "... can take (N)": the bound.
  const auto& m = d.r.message();
  const auto open = m.rfind('(');
  BOOST_TEST_REQUIRE(open != std::string::npos);
  const std::size_t bound = std::stoul(m.substr(open + 1));
  BOOST_TEST(bound > FOOTER_SIZE);
  BOOST_TEST(bound < 4000u);
  expect_refused(with_tail(bound + 1), "more than an index of the 1 entries announced can take");
  const auto at_bound = decode_every_way(with_tail(bound));
  BOOST_TEST_REQUIRE(!at_bound.r);
  BOOST_TEST(at_bound.r.message().find("announced can take") == std::string::npos,
             at_bound.r.message());
  BOOST_TEST(at_bound.r.message().starts_with("tail: "), at_bound.r.message());
  // Nothing of the refused tail was buffered: only the entry's credit... which
  // was released (the recorder drops entries).
  BOOST_TEST(d.buffered == 0u);
}

BOOST_AUTO_TEST_CASE(tail_that_disagrees_with_the_blob_is_refused_naming_the_field) {
  const std::vector<float> x = {1, 2, 3, 4};
  const tag_t tag = tag_of("tail");
  // The entry sent: "x", float32 [4], 16 bytes at 0.
  const auto sent_then = [&](const std::vector<std::byte>& t) {
    outbox o = begun(1, tag);
    layout_builder b;
    entry(o, b, 1, "x", value::tensor(x), 64, 128);
    frame_tail(o, 1, t);
    return bytes_of(o);
  };
  const auto tail_for = [&](const char* key, shape_t shape, const tag_t& tg) {
    layout_builder b;
    (void)b.add(key, value::tensor(x, std::move(shape))).value();
    return tail_of(b, tg);
  };
  const auto good = tail_for("x", {4}, tag);
  BOOST_TEST(decode_every_way(sent_then(good)).r.has_value());

  expect_refused(sent_then(tail_for("y", {4}, tag)), "tail: index rows disagree with the entries sent");
  expect_refused(sent_then(tail_for("x", {2, 2}, tag)), "tail: index rows disagree with the entries sent");
  expect_refused(sent_then(tail_for("x", {4}, NO_TAG)), "tail: footer tag differs from blob_begin's");
  {  // Fewer rows than entries sent (an empty index after the entry).
    layout_builder none;
    auto t = tail_of(none, tag);
    auto f = read_footer(t).value();
    f.index_off = 64;
    encode_footer(f, std::span(t).last(FOOTER_SIZE));
    expect_refused(sent_then(t), "tail: index has 0 rows, 1 entries were sent");
  }
  const auto refooted = [&](auto change) {
    auto t = good;
    auto f = read_footer(t).value();
    change(f);
    encode_footer(f, std::span(t).last(FOOTER_SIZE));
    return t;
  };
  expect_refused(sent_then(refooted([](footer& f) { f.index_off = 128; })),
                 "tail: index_off 128 but entries end at 64");
  expect_refused(sent_then(refooted([](footer& f) { f.index_off = 0; })),
                 "tail: index_off 0 but entries end at 64");
  expect_refused(sent_then(refooted([](footer& f) { f.index_len -= 1; })),
                 "does not fill the " + std::to_string(good.size()) + "-byte tail");
  {  // A version-2 footer (read by read_footer, never streamed).
    auto t = std::vector<std::byte>(good.begin(), good.end() - FOOTER_SIZE);
    const std::uint32_t index_len = static_cast<std::uint32_t>(t.size());
    const std::uint32_t words[] = {MAGIC, 2u, 64u, index_len};  // version | flags 0 as one word
    for (std::uint32_t w : words)
      for (int i = 0; i < 4; ++i) t.push_back(std::byte(static_cast<std::uint8_t>(w >> (8 * i))));
    BOOST_TEST_REQUIRE(read_footer(t).value().version == VERSION_V2);
    expect_refused(sent_then(t), "tail: footer version 2, expected 3");
  }
}

BOOST_AUTO_TEST_CASE(tail_rows_reach_the_listener_whether_the_index_is_canonical_or_not) {
  // docs/wire.md "Consumer": a canonical index (the array header, then
  // exactly the rows announced) is read once, without a second check; an
  // index encoded otherwise (here a 3-byte array header for 2 rows) is
  // parsed, checked and digested row by row. Both complete the blob with
  // the rows the tail holds.
  const tag_t tag = tag_of("rows");
  outbox o = begun(1, tag);
  layout_builder b;
  entry(o, b, 1, "a", bytes_value(pattern(16, 1)), 64, 128);           // inline
  const std::vector<float> x = {1, 2, 3};
  entry(o, b, 1, "bb", value::tensor(x), 0, 128);  // data frames
  const auto prefix = bytes_of(o);
  const auto canonical = tail_of(b, tag);
  auto with = [&](const std::vector<std::byte>& t) {
    outbox x;
    frame_tail(x, 1, t);
    auto s = prefix;
    const auto more = bytes_of(x);
    s.insert(s.end(), more.begin(), more.end());
    return s;
  };
  // The rows as planned: what the index holds.
  const auto f = read_footer(canonical).value();
  const auto planned =
      parse_index(std::span(canonical).first(f.index_len), f.index_off).value();
  BOOST_TEST_REQUIRE(planned.size() == 2u);
  BOOST_TEST_REQUIRE(std::to_integer<int>(canonical[0]) == 0x92);
  const auto fast = decode_every_way(with(canonical));
  BOOST_TEST_REQUIRE(fast.r.has_value(), fast.r.message());
  BOOST_TEST((fast.rows.at(1) == planned));
  // The same rows under a 16-bit array header: not canonical.
  std::vector<std::byte> wide = {std::byte{0xdc}, std::byte{0}, std::byte{2}};
  wide.insert(wide.end(), canonical.begin() + 1, canonical.end());
  auto wf = f;
  wf.index_len += 2;
  encode_footer(wf, std::span(wide).last(FOOTER_SIZE));
  const auto slow = decode_every_way(with(wide));
  BOOST_TEST_REQUIRE(slow.r.has_value(), slow.r.message());
  BOOST_TEST((slow.rows.at(1) == planned));
}

BOOST_AUTO_TEST_CASE(tail_whose_header_claims_other_rows_than_the_announced_ones_is_refused) {
  // The rows after the header digest to the announced ones, but the header
  // declares three: the known rows are read only under their own count.
  const tag_t tag = tag_of("count");
  outbox o = begun(1, tag);
  layout_builder b;
  entry(o, b, 1, "a", bytes_value(pattern(16, 1)), 64, 128);
  entry(o, b, 1, "b", bytes_value(pattern(8, 2)), 64, 128);
  auto t = tail_of(b, tag);
  BOOST_TEST_REQUIRE(std::to_integer<int>(t[0]) == 0x92);
  t[0] = std::byte{0x93};
  frame_tail(o, 1, t);
  expect_refused(bytes_of(o), "tail: index is not an array of the 2 rows expected");
}

// ---- every other refusal -----------------------------------------------------------

namespace {

struct refusal {
  const char* name;
  std::function<void(outbox&)> frames;  // after the hello
  std::string what;                     // the message names it
  std::function<void(decoder_limits&)> limits = [](decoder_limits&) {};
  bool hello = true;
  wire_role from = wire_role::sender;
};

const std::vector<std::byte> tag16(TAG_SIZE, std::byte{7});

std::vector<refusal> refusals() {
  std::vector<refusal> v;
  const auto grouped = [](outbox& o, std::uint64_t id) {
    std::vector<std::byte> p(tag16);
    p.resize(TAG_SIZE + blob_group_bytes);
    encode_blob_group({5, 2}, std::span(p).subspan(TAG_SIZE));
    raw(o, {.type = frame_type::blob_begin, .flags = frame_flag_group, .blob_id = id}, p);
  };
  const auto one_entry = [](outbox& o) {
    frame_blob_begin(o, 1, tag_of("t"));
    begin_entry(o, 1, 0, f32_entry("x", 0, 25));  // [0, 100)
  };
  // -- handshake
  v.push_back({"hello twice", [](outbox& o) { frame_hello(o, sender_hello); },
               "hello after the handshake"});
  v.push_back({"short hello", [](outbox& o) {
                 raw(o, {.type = frame_type::hello}, std::vector<std::byte>(63));
               }, "hello: 63 bytes, expected 64 to 4096", {}, false});
  v.push_back({"a consumer's hello where a sender's is due", [](outbox& o) {
                 frame_hello(o, {.role = wire_role::consumer});
               }, "hello: role consumer, expected sender", {}, false});
  v.push_back({"a sender's hello where a consumer's is due", [](outbox& o) {
                 frame_hello(o, sender_hello);
               }, "hello: role sender, expected consumer", {}, false, wire_role::consumer});
  v.push_back({"an extension shorter than its 4-byte header", [](outbox& o) {
                 auto p = encode_hello(sender_hello);
                 p.resize(hello_size + 2);
                 p[60] = std::byte{2};  // extension bytes: 2
                 raw(o, {.type = frame_type::hello}, p);
               }, "hello: truncated extension header", {}, false});
  v.push_back({"bad magic", [](outbox& o) {
                 auto p = encode_hello(sender_hello);
                 p[0] = std::byte{'X'};
                 raw(o, {.type = frame_type::hello}, p);
               }, "hello: bad magic (not a blobpipe peer)", {}, false});
  v.push_back({"another version", [](outbox& o) {
                 auto p = encode_hello(sender_hello);
                 p[4] = std::byte{9};
                 raw(o, {.type = frame_type::hello}, p);
               }, "unsupported wire version 9", {}, false});
  v.push_back({"sender frames to a sender", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
               }, "unexpected blob_begin frame from consumer", {}, true, wire_role::consumer});
  // -- blob_begin
  v.push_back({"group not negotiated", [&](outbox& o) { grouped(o, 1); },
               "a group, but the blob-groups feature was not negotiated"});
  v.push_back({"blob_begin payload", [](outbox& o) {
                 raw(o, {.type = frame_type::blob_begin, .blob_id = 1}, std::vector<std::byte>(17));
               }, "blob_begin: payload of 17 bytes, expected 16"});
  v.push_back({"blob id reused", [](outbox& o) {
                 frame_blob_begin(o, 5, tag_of("a"));
                 frame_blob_begin(o, 5, tag_of("b"));
               }, "blob_begin: blob id 5 not above 5"});
  v.push_back({"blob id going down", [](outbox& o) {
                 frame_blob_begin(o, 5, tag_of("a"));
                 frame_blob_abort(o, 5, "");
                 frame_blob_begin(o, 4, tag_of("b"));
               }, "blob_begin: blob id 4 not above 5"});
  v.push_back({"group of size 0", [](outbox& o) {
                 std::vector<std::byte> p(tag16);
                 p.resize(TAG_SIZE + blob_group_bytes);
                 encode_blob_group({5, 0}, std::span(p).subspan(TAG_SIZE));
                 raw(o, {.type = frame_type::blob_begin, .flags = frame_flag_group, .blob_id = 1}, p);
               }, "group 5 of size 0", [](decoder_limits& l) { l.features = feature_blob_groups; }});
  // -- entry_begin
  v.push_back({"entry for an unknown blob", [](outbox& o) {
                 begin_entry(o, 9, 0, f32_entry("x", 0, 1));
               }, "entry_begin for unknown blob 9"});
  v.push_back({"entry before the last completed", [&](outbox& o) {
                 one_entry(o);
                 begin_entry(o, 1, 1, f32_entry("y", 128, 1));
               }, "entry_begin before entry 0 of blob 1 was complete"});
  v.push_back({"entry index skipped", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 begin_entry(o, 1, 1, f32_entry("x", 0, 1));
               }, "entry_begin: entry index 1, expected 0"});
  v.push_back({"entry index repeated", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 begin_entry(o, 1, 0, f32_entry("x", 0, 0));  // empty: complete at once
                 begin_entry(o, 1, 0, f32_entry("y", 0, 0));
               }, "entry_begin: entry index 0, expected 1"});
  v.push_back({"timestamp not negotiated", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 const Entry e = f32_entry("x", 0, 1);
                 frame_entry_begin(o, 1, 0, e, e.meta(), std::uint64_t{12345});
               }, "a timestamp, but the entry-timestamps feature was not negotiated"});
  v.push_back({"entry_begin payload too short", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 raw(o, {.type = frame_type::entry_begin, .blob_id = 1}, std::vector<std::byte>(8));
               }, "entry_begin: payload of 8 bytes not in [9, "});
  v.push_back({"entry_begin payload too long", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 raw(o, {.type = frame_type::entry_begin, .blob_id = 1},
                     std::vector<std::byte>(8 + 100 + 100 + 1));
               }, "entry_begin: payload of 209 bytes not in [9, 208]",
               [](decoder_limits& l) { l.max_key_bytes = 100; l.max_meta_bytes = 100; }});
  v.push_back({"meta longer than max_meta_bytes", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 begin_entry(o, 1, 0, f32_entry("x", 0, 1));
               }, "entry_begin: meta size " + std::to_string(f32_entry("x", 0, 1).meta().size()) +
                      " not in [1, 16]",
               [](decoder_limits& l) { l.max_meta_bytes = 16; }});
  v.push_back({"bytes after the meta of an entry not inline", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 const Entry e = f32_entry("x", 0, 1);
                 raw(o, {.type = frame_type::entry_begin, .blob_id = 1},
                     encode_entry_begin("x", e.meta(), std::vector<std::byte>(4)));
               }, "entry_begin: 4 bytes after the meta of an entry that is not inline"});
  v.push_back({"entry meta not a meta", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 const std::vector<std::byte> junk(4, std::byte{0xC1});
                 raw(o, {.type = frame_type::entry_begin, .blob_id = 1},
                     encode_entry_begin("x", junk));
               }, "entry_begin meta: "});
  v.push_back({"entry not where the last ended", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 begin_entry(o, 1, 0, f32_entry("x", 128, 1));
               }, "entry 'x': offset 128, expected 0"});
  v.push_back({"inline bytes short", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 const Entry e = f32_entry("x", 0, 4);
                 const std::vector<std::byte> eight(8);
                 raw(o, {.type = frame_type::entry_begin, .flags = frame_flag_inline, .blob_id = 1},
                     encode_entry_begin("x", e.meta(), eight));
               }, "entry 'x': 8 inline bytes for an entry of 16"});
  v.push_back({"inline entry above inline_bytes", [](outbox& o) {
                 // 8 + key + meta + 128 passes the header's bound, which leaves
                 // the unused key and meta room: the entry's own check refuses.
                 frame_blob_begin(o, 1, tag_of("t"));
                 const Entry e = f32_entry("x", 0, 32);  // 128 bytes
                 const std::vector<std::byte> bytes(128);
                 raw(o, {.type = frame_type::entry_begin, .flags = frame_flag_inline, .blob_id = 1},
                     encode_entry_begin("x", e.meta(), bytes));
               }, "entry 'x': 128 inline bytes exceed the negotiated inline_bytes 64",
               [](decoder_limits& l) { l.inline_bytes = 64; }});
  v.push_back({"inline flag on an empty entry", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 const Entry e = f32_entry("x", 0, 0);
                 raw(o, {.type = frame_type::entry_begin, .flags = frame_flag_inline, .blob_id = 1},
                     encode_entry_begin("x", e.meta(), {}));
               }, "entry 'x': the inline flag on an entry of 0 bytes"});
  v.push_back({"entry over the window", [](outbox& o) {
                 // Entry "a" of blob 1 is open (its credit held); "b" of blob 2
                 // needs more than the window has left.
                 frame_blob_begin(o, 1, tag_of("t"));
                 frame_blob_begin(o, 2, tag_of("u"));
                 begin_entry(o, 1, 0, f32_entry("a", 0, 2));
                 begin_entry(o, 2, 0, f32_entry("b", 0, 200));
               }, "entry of " + std::to_string(entry_credit(800, 1, f32_entry("b", 0, 200).meta().size())) +
                      " credit bytes overruns the window (",
               [](decoder_limits& l) { l.window_bytes = 1024; }});
  // -- data
  v.push_back({"data for an unknown blob", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 raw(o, {.type = frame_type::data, .blob_id = 2, .arg = 0}, std::vector<std::byte>(4));
               }, "data for unknown blob 2"});
  v.push_back({"data with no entry open", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 raw(o, {.type = frame_type::data, .blob_id = 1, .arg = 0}, std::vector<std::byte>(4));
               }, "data for blob 1 with no entry open"});
  v.push_back({"empty data frame", [&](outbox& o) {
                 one_entry(o);
                 raw(o, {.type = frame_type::data, .blob_id = 1, .arg = 0});
               }, "data: chunk of 0 bytes not in [1, "});
  v.push_back({"data at a skipped offset", [&](outbox& o) {
                 one_entry(o);
                 raw(o, {.type = frame_type::data, .blob_id = 1, .arg = 200}, std::vector<std::byte>(4));
               }, "data: offset 200 for entry 'x' [0, 100), expected 0"});
  v.push_back({"data past the entry", [&](outbox& o) {
                 one_entry(o);
                 raw(o, {.type = frame_type::data, .blob_id = 1, .arg = 0}, std::vector<std::byte>(64));
                 raw(o, {.type = frame_type::data, .blob_id = 1, .arg = 64}, std::vector<std::byte>(64));
               }, "data: chunk runs past the end of entry 'x' (offset 64 + 64 > 100)"});
  // -- tail
  v.push_back({"tail for an unknown blob", [](outbox& o) {
                 raw(o, {.type = frame_type::tail, .blob_id = 3}, std::vector<std::byte>(40));
               }, "tail for unknown blob 3"});
  v.push_back({"tail before the entry completed", [&](outbox& o) {
                 one_entry(o);
                 raw(o, {.type = frame_type::tail, .blob_id = 1}, std::vector<std::byte>(40));
               }, "tail before entry 'x' was complete"});
  v.push_back({"tail shorter than a footer", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 raw(o, {.type = frame_type::tail, .blob_id = 1}, std::vector<std::byte>(32));
               }, "tail: 32 bytes not in [33, "});
  v.push_back({"tail of junk", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 raw(o, {.type = frame_type::tail, .blob_id = 1}, std::vector<std::byte>(36));
               }, "tail: "});
  v.push_back({"huge tail header", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 std::array<std::byte, frame_header_size> h;
                 encode_frame_header({.type = frame_type::tail, .length = 0xFFFFFFF0u, .blob_id = 1}, h);
                 std::memcpy(o.append(h.size()).data(), h.data(), h.size());
               }, "tail length 4294967280"});
  // -- blob_abort, ack, close
  v.push_back({"abort of an unknown blob", [](outbox& o) { frame_blob_abort(o, 4, "x"); },
               "blob_abort for unknown blob 4"});
  v.push_back({"abort reason too long", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 raw(o, {.type = frame_type::blob_abort, .blob_id = 1},
                     std::vector<std::byte>(max_reason_bytes + 1, std::byte{'r'}));
               }, "blob_abort: reason too long"});
  v.push_back({"an ack from a sender", [](outbox& o) { frame_ack(o, 10, 0); },
               "unexpected ack frame from sender"});
  v.push_back({"credit request not negotiated", [](outbox& o) { frame_credit_request(o, 10); },
               "credit request, but the credit-grants feature was not negotiated"});
  v.push_back({"credit request with a blob id", [](outbox& o) {
                 raw(o, {.type = frame_type::ack, .flags = frame_flag_credit_request, .blob_id = 3});
               }, "credit request with a payload or a blob id",
               [](decoder_limits& l) { l.features = feature_credit_grants; }});
  v.push_back({"a credit request from the consumer", [](outbox& o) {
                 raw(o, {.type = frame_type::ack, .flags = frame_flag_credit_request});
               }, "ack: a credit request from the consumer", {}, true, wire_role::consumer});
  v.push_back({"ack with a payload", [](outbox& o) {
                 raw(o, {.type = frame_type::ack}, std::vector<std::byte>(4));
               }, "ack with a payload", {}, true, wire_role::consumer});
  v.push_back({"close reason too long", [](outbox& o) {
                 raw(o, {.type = frame_type::close},
                     std::vector<std::byte>(max_reason_bytes + 1, std::byte{'r'}));
               }, "close: reason too long"});
  v.push_back({"bytes after close", [](outbox& o) {
                 frame_close(o, "bye");
                 frame_blob_begin(o, 1, tag_of("t"));
               }, "bytes after the peer's close frame"});
  // -- frame headers
  v.push_back({"unknown frame type", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 raw(o, {.type = static_cast<frame_type>(42), .blob_id = 1});
               }, "frame header: unknown frame type 42"});
  v.push_back({"unknown flag", [](outbox& o) {
                 frame_blob_begin(o, 1, tag_of("t"));
                 raw(o, {.type = frame_type::data, .flags = 0x80, .blob_id = 1}, std::vector<std::byte>(4));
               }, "frame header: data flags"});
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_refusal_names_its_frame_and_field_in_every_chunking) {
  for (const auto& c : refusals()) {
    BOOST_TEST_CONTEXT(c.name) {
      outbox o;
      if (c.hello) frame_hello(o, {.role = c.from});
      c.frames(o);
      decoder_limits lim;
      if (c.limits) c.limits(lim);
      expect_refused(bytes_of(o), c.what, lim, c.from);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_stray_client_is_refused_on_its_first_bytes) {
  // Fewer bytes than a header, and not a hello's first four: refused at
  // once, whichever way they come, without waiting for a whole header.
  const std::string_view http = "GET / HTTP/1.0\r\n\r\n";
  const auto s = std::as_bytes(std::span(http.data(), http.size()));
  expect_refused(s, "the first bytes are not a blobpipe hello");
  // A whole frame of another type first: named as such when it arrives
  // whole, on its first byte when it trickles in.
  outbox o;
  frame_blob_begin(o, 1, tag_of("t"));
  const auto whole = decode(bytes_of(o), {}, feeding::whole);
  BOOST_TEST_REQUIRE(!whole.r);
  BOOST_TEST(whole.r.message() == "first frame is blob_begin, expected hello");
  const auto trickle = decode(bytes_of(o), {}, feeding::bytewise);
  BOOST_TEST_REQUIRE(!trickle.r);
  BOOST_TEST(trickle.r.message().starts_with("the first bytes are not a blobpipe hello"),
             trickle.r.message());
}

BOOST_AUTO_TEST_CASE(grouped_blobs_and_credit_requests_pass_when_negotiated) {
  // The frame forms of features pass once negotiated (the refusals above
  // are about the features, not the frames).
  decoder_limits lim;
  lim.features = feature_blob_groups | feature_credit_grants | feature_entry_timestamps;
  outbox o;
  frame_hello(o, sender_hello);
  frame_blob_begin(o, 1, tag_of("g"), blob_group{5, 2});
  const Entry e = f32_entry("x", 0, 1);
  frame_entry_begin(o, 1, 0, e, e.meta(), std::uint64_t{777});
  raw(o, {.type = frame_type::data, .blob_id = 1, .arg = 0}, std::vector<std::byte>(4));
  frame_credit_request(o, 4096);
  lim.window_bytes = 1 << 20;
  const auto d = decode_every_way(bytes_of(o), lim);
  BOOST_TEST_REQUIRE(d.r.has_value(), d.r.message());
  BOOST_TEST((std::find(d.lines.begin(), d.lines.end(), "blob_group 1 group=5/2") != d.lines.end()));
  BOOST_TEST((std::find(d.lines.begin(), d.lines.end(), "credit_request 4096") != d.lines.end()));
}

// ---- turns of work (consume_some): docs/cluster.md "Fair turns" --------------

BOOST_AUTO_TEST_CASE(a_turn_of_work_completes_64_begin_abort_frames_not_a_buffer_of_them) {
  // A begin+abort flood: 4,096 pairs of 40- and 24-byte frames fill a
  // 256 KiB receive buffer; consume() decodes them all at once. A turn of
  // 256 KiB of work counts each frame as at least 4 KiB, so it completes 64
  // frames (32 pairs) and leaves the rest for later turns, which report the
  // same events as consume() does.
  constexpr std::uint64_t pairs = 4096;
  constexpr std::uint64_t turn = 256u << 10;
  static_assert(turn / decoder::frame_work_floor_bytes == 64);
  outbox h;
  frame_hello(h, sender_hello);
  const std::size_t hello_bytes = h.size();
  outbox o;
  frame_hello(o, sender_hello);
  for (std::uint64_t id = 1; id <= pairs; ++id) {
    frame_blob_begin(o, id, tag_of("flood"));
    frame_blob_abort(o, id, "");
  }
  const auto s = bytes_of(o);
  constexpr std::size_t pair_bytes = 2 * frame_header_size + TAG_SIZE;
  BOOST_TEST_REQUIRE(s.size() == hello_bytes + pairs * pair_bytes);

  const decoded whole = decode(s, {}, feeding::whole);
  BOOST_TEST_REQUIRE(whole.r.has_value(), whole.r.message());
  BOOST_TEST_REQUIRE(whole.lines.size() == 1 + 2 * pairs);

  recorder l;
  decoder d(wire_role::sender, {}, l);
  l.dec = &d;
  BOOST_TEST_REQUIRE(d.consume(std::span(s).first(hello_bytes)).has_value());
  std::size_t at = hello_bytes;
  std::size_t turns = 0;
  while (at < s.size()) {
    d.reset_work();
    const std::size_t before = l.lines.size();
    auto took = d.consume_some(std::span(s).subspan(at), turn);
    BOOST_TEST_REQUIRE(took.has_value(), took.message());
    // Exactly 64 frames: their bytes, each charged up to 4 KiB.
    BOOST_TEST_REQUIRE(*took == 32 * pair_bytes);
    BOOST_TEST_REQUIRE(l.lines.size() - before == 64u);
    BOOST_TEST(d.work() == turn);
    at += *took;
    ++turns;
  }
  BOOST_TEST(turns == std::size_t(pairs / 32));
  BOOST_TEST(l.lines == whole.lines, boost::test_tools::per_element());
  BOOST_TEST(d.open_blobs() == 0u);
}

// A peer's progress (docs/reliability.md "Timeouts") is bytes the window
// admitted: blob_begin, blob_abort with its reason, entry_begin's key and
// meta, a credit request and close are none of it, so a stream of them
// cannot keep a stalled connection alive. An entry's bytes count as they
// arrive, also when its blob is then aborted.
BOOST_AUTO_TEST_CASE(admitted_bytes_count_entry_and_tail_bytes_not_control_frames) {
  outbox o;
  frame_hello(o, sender_hello);
  const std::string reason(4000, 'r');
  for (std::uint64_t id = 1; id <= 20; ++id) {
    frame_blob_begin(o, id, tag_of("flood"));
    frame_blob_abort(o, id, reason);
  }
  frame_blob_begin(o, 30, tag_of("partial"));
  const Entry e = f32_entry(std::string(300, 'k'), 0, 100);  // 400 bytes, a long key
  begin_entry(o, 30, 0, e);
  std::vector<std::byte> part(150, std::byte{1});
  raw(o, {.type = frame_type::data, .blob_id = 30, .arg = 0}, part);
  frame_blob_abort(o, 30, reason);
  raw(o, {.type = frame_type::ack, .flags = frame_flag_credit_request, .arg = 1 << 20});
  frame_close(o, reason);
  decoder_limits lim;
  lim.features = feature_credit_grants;
  lim.window_bytes = 1 << 20;
  const auto d = decode_every_way(bytes_of(o), lim);
  BOOST_TEST_REQUIRE(d.r.has_value(), d.r.message());
  BOOST_TEST(d.closed);
  BOOST_TEST(d.admitted == 150u);
}

BOOST_AUTO_TEST_CASE(a_turn_counts_large_frames_by_their_bytes) {
  // Frames longer than the floor cost their bytes: a turn of 256 KiB
  // takes hello, blob_begin and entry_begin (4 KiB of work each) and four
  // 64 KiB data frames, which spend it; the fifth waits for the next turn.
  decoder_limits lim;
  lim.max_chunk_bytes = 64u << 10;
  const std::vector<std::byte> chunk(64u << 10, std::byte{1});
  outbox o;
  frame_hello(o, sender_hello);
  frame_blob_begin(o, 1, tag_of("big"));
  const Entry e = f32_entry("x", 0, 5 * 16 * 1024);  // five chunks
  begin_entry(o, 1, 0, e);
  for (std::uint64_t k = 0; k < 5; ++k)
    raw(o, {.type = frame_type::data, .blob_id = 1, .arg = k * chunk.size()}, chunk);
  const auto s = bytes_of(o);
  const std::size_t last = frame_header_size + chunk.size();
  recorder l;
  decoder d(wire_role::sender, lim, l);
  l.dec = &d;
  auto took = d.consume_some(s, 256u << 10);
  BOOST_TEST_REQUIRE(took.has_value(), took.message());
  BOOST_TEST(*took == s.size() - last);
  BOOST_TEST(d.work() == 3 * decoder::frame_work_floor_bytes + 4 * last);
  BOOST_TEST((std::find(l.lines.begin(), l.lines.end(), "entry_complete 1/0") == l.lines.end()));
  d.reset_work();
  auto rest = d.consume_some(std::span(s).subspan(*took), 256u << 10);
  BOOST_TEST_REQUIRE(rest.has_value(), rest.message());
  BOOST_TEST(*rest == last);
  BOOST_TEST((std::find(l.lines.begin(), l.lines.end(), "entry_complete 1/0") != l.lines.end()));
}

BOOST_AUTO_TEST_CASE(bytes_after_a_close_frame_are_refused_whatever_the_turn_left) {
  outbox o;
  frame_hello(o, sender_hello);
  frame_close(o, "bye");
  auto s = bytes_of(o);
  s.push_back(std::byte{0});
  recorder l;
  decoder d(wire_role::sender, {}, l);
  l.dec = &d;
  // A budget spent by the close frame itself.
  auto took = d.consume_some(s, 2 * decoder::frame_work_floor_bytes);
  BOOST_TEST_REQUIRE(!took);
  BOOST_TEST(took.message().find("bytes after the peer's close frame") != std::string::npos,
             took.message());
}

// ---- the listener's refusals and the message transport's calls ------------------

namespace {

/// A recorder that refuses one event, as a consumer over a limit of its
/// own or out of memory does, or gives entry_begin a destination one byte
/// short of the entry.
class refusing final : public recorder {
 public:
  enum class at { blob_begin, entry_begin, entry_complete, short_destination };
  explicit refusing(at where) : where_(where) {}

  result<void*> on_blob_begin(std::uint64_t id, const tag_t& tag) override {
    if (where_ == at::blob_begin) return refusal();
    return recorder::on_blob_begin(id, tag);
  }
  result<std::span<std::byte>> on_entry_begin(void* blob, const entry_announcement& a) override {
    if (where_ == at::entry_begin) return refusal();
    auto dest = recorder::on_entry_begin(blob, a);
    if (where_ == at::short_destination && dest && !dest->empty())
      return dest->first(dest->size() - 1);
    return dest;
  }
  result<void> on_entry_complete(void* blob, std::uint64_t id) override {
    if (where_ == at::entry_complete) return refusal();
    return recorder::on_entry_complete(blob, id);
  }

 private:
  static error refusal() { return {errc::too_large, "the listener refuses"}; }
  at where_;
};

/// hello, blob 1, one 200-byte entry in data frames of 128 (not inline).
std::vector<std::byte> one_chunked_entry() {
  outbox o;
  frame_hello(o, sender_hello);
  layout_builder b;
  frame_blob_begin(o, 1, tag_of("t"));
  entry(o, b, 1, "e0", bytes_value(pattern(200, 1)), 64, 128);
  return bytes_of(o);
}

/// Feeds `s` whole to a decoder with `l`; the decoder's answer.
result<void> feed_whole(refusing& l, std::span<const std::byte> s) {
  decoder_limits lim;
  lim.max_chunk_bytes = 128;
  lim.inline_bytes = 64;
  decoder d(wire_role::sender, lim, l);
  l.dec = &d;
  auto r = d.consume(s);
  if (!r) {
    const std::byte one{0};
    auto again = d.consume(std::span(&one, 1));
    BOOST_TEST(!again, "the decoder goes on after its listener refused");
  }
  return r;
}

}  // namespace

// docs/wire.md "Consumer": what the listener refuses ends the stream with
// the listener's own error, whichever event it refused.
BOOST_AUTO_TEST_CASE(a_listener_refusal_ends_the_stream_with_its_error) {
  const auto s = one_chunked_entry();
  for (auto where : {refusing::at::blob_begin, refusing::at::entry_begin,
                     refusing::at::entry_complete}) {
    BOOST_TEST_CONTEXT("refused at " << static_cast<int>(where)) {
      refusing l(where);
      auto r = feed_whole(l, s);
      BOOST_TEST_REQUIRE(!r, "the decoder accepted what its listener refused");
      BOOST_TEST((r.code() == errc::too_large), r.message());
      BOOST_TEST(r.message() == "the listener refuses");
      for (const auto& line : l.lines) BOOST_TEST(!line.starts_with("blob_complete"), line);
    }
  }
}

// decoder.hpp on_entry_begin: a destination is empty (drop the bytes) or
// exactly the entry's length; any other is the listener's bug, refused
// before a byte lands in it.
BOOST_AUTO_TEST_CASE(a_destination_of_the_wrong_length_is_invalid_argument) {
  refusing l(refusing::at::short_destination);
  auto r = feed_whole(l, one_chunked_entry());
  BOOST_TEST_REQUIRE(!r);
  BOOST_TEST((r.code() == errc::invalid_argument), r.message());
  BOOST_TEST(r.message().find("on_entry_begin: destination of 199 bytes for 200") !=
                 std::string::npos,
             r.message());
}

// decoder.hpp commit_payload: only a payload's bytes, at most what is left
// of it, may be committed.
BOOST_AUTO_TEST_CASE(commit_payload_outside_a_payload_or_past_it_is_invalid_argument) {
  {
    recorder l;
    decoder d(wire_role::sender, {}, l);
    l.dec = &d;
    auto r = d.commit_payload(1);  // no frame yet
    BOOST_TEST_REQUIRE(!r);
    BOOST_TEST((r.code() == errc::invalid_argument), r.message());
    BOOST_TEST(r.message().find("commit_payload: no payload of that size") != std::string::npos,
               r.message());
  }
  const auto s = one_chunked_entry();
  recorder l;
  decoder_limits lim;
  lim.max_chunk_bytes = 128;
  lim.inline_bytes = 64;
  decoder d(wire_role::sender, lim, l);
  l.dec = &d;
  std::size_t at = 0;
  while (at < s.size() && !d.in_payload()) {
    const std::size_t n = std::max<std::size_t>(d.next_required_size(), 1);
    BOOST_TEST_REQUIRE(d.consume(std::span(s).subspan(at, n)).has_value());
    at += n;
  }
  BOOST_TEST_REQUIRE(d.in_payload(), "no payload in the stream");
  auto r = d.commit_payload(d.payload_remaining() + 1);
  BOOST_TEST_REQUIRE(!r);
  BOOST_TEST((r.code() == errc::invalid_argument), r.message());
  BOOST_TEST(r.message().find("commit_payload: no payload of that size") != std::string::npos,
             r.message());
}
