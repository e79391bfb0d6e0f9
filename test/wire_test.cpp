// Frame codec (blobpipe/protocol/wire.hpp): headers, hello, entry_begin
// payloads, byte for byte against the layout in docs/wire.md; the outbox
// frames are appended to (blobpipe/protocol/framer.hpp).
#define BOOST_TEST_MODULE wire
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "blobpipe/protocol/framer.hpp"
#include "blobpipe/protocol/wire.hpp"

using namespace blobpipe;

namespace {

std::uint64_t le(std::span<const std::byte> b, std::size_t off, std::size_t n) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t(std::to_integer<std::uint8_t>(b[off + i])) << (8 * i);
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(frame_header_fields_sit_at_the_documented_offsets) {
  const frame_header h{.type = frame_type::entry_begin, .flags = frame_flag_inline,
                       .length = 0x01020304, .blob_id = 7, .arg = 0x1122334455667788ull};
  std::array<std::byte, frame_header_size> buf;
  encode_frame_header(h, buf);
  // docs/wire.md "Frame header": type 0, flags 1, reserved 2..3, length 4,
  // blob_id 8, arg 16; little-endian.
  BOOST_TEST(le(buf, 0, 1) == 3u);
  BOOST_TEST(le(buf, 1, 1) == 1u);
  BOOST_TEST(le(buf, 2, 2) == 0u);
  BOOST_TEST(le(buf, 4, 4) == 0x01020304u);
  BOOST_TEST(le(buf, 8, 8) == 7u);
  BOOST_TEST(le(buf, 16, 8) == 0x1122334455667788ull);
  auto d = decode_frame_header(buf, default_max_frame_bytes);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST((*d == h));
}

BOOST_AUTO_TEST_CASE(frame_header_rejects_unknown_type_flags_reserved_and_oversized_length) {
  std::array<std::byte, frame_header_size> buf;
  encode_frame_header({.type = frame_type::ack}, buf);
  auto bad = buf;
  bad[0] = std::byte{0};
  BOOST_TEST((decode_frame_header(bad, 1024).code() == errc::protocol_violation));
  bad[0] = std::byte{9};
  BOOST_TEST((decode_frame_header(bad, 1024).code() == errc::protocol_violation));
  bad = buf;
  bad[1] = std::byte{1};  // the inline flag belongs to entry_begin only
  BOOST_TEST((decode_frame_header(bad, 1024).code() == errc::protocol_violation));
  bad = buf;
  bad[3] = std::byte{1};
  BOOST_TEST((decode_frame_header(bad, 1024).code() == errc::protocol_violation));
  encode_frame_header({.type = frame_type::entry_begin, .flags = 2}, buf);  // unknown flag
  BOOST_TEST((decode_frame_header(buf, 1024).code() == errc::protocol_violation));
  encode_frame_header({.type = frame_type::entry_begin, .flags = frame_flag_inline}, buf);
  BOOST_TEST(decode_frame_header(buf, 1024).has_value());
  encode_frame_header({.type = frame_type::tail, .length = 1025}, buf);
  BOOST_TEST((decode_frame_header(buf, 1024).code() == errc::protocol_violation));
  BOOST_TEST(decode_frame_header(buf, 1025).has_value());
  BOOST_TEST((decode_frame_header(std::span(buf).first(23), 1025).code() == errc::too_small));
}

BOOST_AUTO_TEST_CASE(hello_fields_sit_at_the_documented_offsets) {
  session_id sid{};
  sid[0] = std::byte{0xAB};
  sid[15] = std::byte{0xCD};
  const hello h{.role = wire_role::consumer, .max_chunk_bytes = 4096, .max_key_bytes = 99,
                .window_bytes = 1ull << 40, .max_meta_bytes = 512, .dedup_window = 777,
                .session = sid, .features = 0, .inline_bytes = 1000};
  auto p = encode_hello(h);
  BOOST_TEST(p.size() == hello_size);
  BOOST_TEST(hello_size == 64u);
  // docs/wire.md "Handshake".
  BOOST_TEST(le(p, 0, 4) == 0x50575042u);  // "BPWP"
  BOOST_TEST(std::memcmp(p.data(), "BPWP", 4) == 0);
  BOOST_TEST(le(p, 4, 2) == 3u);
  BOOST_TEST(le(p, 6, 2) == 2u);
  BOOST_TEST(le(p, 8, 4) == 4096u);
  BOOST_TEST(le(p, 12, 4) == 99u);
  BOOST_TEST(le(p, 16, 8) == (1ull << 40));
  BOOST_TEST(le(p, 24, 4) == 512u);
  BOOST_TEST(le(p, 28, 4) == 777u);
  BOOST_TEST(le(p, 32, 1) == 0xABu);
  BOOST_TEST(le(p, 47, 1) == 0xCDu);
  BOOST_TEST(le(p, 48, 8) == 0u);
  BOOST_TEST(le(p, 56, 4) == 1000u);
  BOOST_TEST(le(p, 60, 2) == 0u);  // extension bytes
  BOOST_TEST(le(p, 62, 2) == 0u);  // reserved
  auto d = decode_hello(p);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST((*d == h));
}

BOOST_AUTO_TEST_CASE(hello_extensions_round_trip_and_must_fill_the_payload) {
  hello h;
  h.extensions.push_back({.type = 7, .value = {std::byte{1}, std::byte{2}, std::byte{3}}});
  h.extensions.push_back({.type = 9, .value = {}});
  auto p = encode_hello(h);
  BOOST_TEST(p.size() == hello_size + 4 + 3 + 4);
  BOOST_TEST(le(p, 60, 2) == 11u);
  BOOST_TEST(le(p, 64, 2) == 7u);  // type, length, value
  BOOST_TEST(le(p, 66, 2) == 3u);
  auto d = decode_hello(p);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST((*d == h));
  auto longer = p;
  longer.push_back(std::byte{0});  // a byte the extension length does not cover
  BOOST_TEST((decode_hello(longer).code() == errc::protocol_violation));
  auto overrun = p;
  overrun[66] = std::byte{200};  // an extension running past the hello
  BOOST_TEST((decode_hello(overrun).code() == errc::protocol_violation));
}

BOOST_AUTO_TEST_CASE(hello_rejects_bad_magic_version_role_chunk_inline_and_reserved) {
  const auto p = encode_hello({});
  auto bad = p;
  bad[0] = std::byte{0};
  BOOST_TEST((decode_hello(bad).code() == errc::protocol_violation));
  // A version-2 peer (48-byte hello) is refused by name, before its size.
  bad = p;
  bad[4] = std::byte{2};
  const auto v2 = decode_hello(std::span(bad).first(48));
  BOOST_TEST((v2.code() == errc::protocol_violation));
  BOOST_TEST(v2.message().find("version 2") != std::string::npos, v2.message());
  BOOST_TEST(v2.message().find("speaks 3") != std::string::npos, v2.message());
  bad = p;
  bad[4] = std::byte{4};  // a newer version
  BOOST_TEST((decode_hello(bad).code() == errc::protocol_violation));
  bad = p;
  bad[6] = std::byte{3};  // role 3
  BOOST_TEST((decode_hello(bad).code() == errc::protocol_violation));
  bad = p;
  bad[62] = std::byte{1};  // reserved
  BOOST_TEST((decode_hello(bad).code() == errc::protocol_violation));
  BOOST_TEST((decode_hello(encode_hello({.max_chunk_bytes = 63})).code() ==
              errc::protocol_violation));
  BOOST_TEST((decode_hello(encode_hello({.inline_bytes = max_inline_bytes + 1})).code() ==
              errc::protocol_violation));
  // Each bound itself is within the limits.
  BOOST_TEST(decode_hello(encode_hello({.max_chunk_bytes = min_chunk_bytes})).has_value());
  BOOST_TEST(decode_hello(encode_hello({.inline_bytes = max_inline_bytes})).has_value());
  BOOST_TEST((decode_hello(std::span(p).first(63)).code() == errc::protocol_violation));
  BOOST_TEST((decode_hello(std::span(p).first(4)).code() == errc::protocol_violation));
}

BOOST_AUTO_TEST_CASE(entry_begin_splits_key_meta_and_inline_bytes_within_limits) {
  const std::array<std::byte, 3> meta{std::byte{0x85}, std::byte{1}, std::byte{2}};
  const std::array<std::byte, 2> bytes{std::byte{9}, std::byte{8}};
  auto p = encode_entry_begin("key", meta);
  BOOST_TEST(p.size() == 8u + 3 + 3);
  BOOST_TEST(le(p, 0, 4) == 3u);  // key_len, then meta_len
  BOOST_TEST(le(p, 4, 4) == 3u);
  auto d = decode_entry_begin(p, false, 16, 16);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST(d->key == "key");
  BOOST_TEST(d->meta.size() == 3u);
  BOOST_TEST(d->inline_bytes.empty());
  auto with = encode_entry_begin("key", meta, bytes);
  auto di = decode_entry_begin(with, true, 16, 16);
  BOOST_TEST_REQUIRE(di.has_value());
  BOOST_TEST(di->inline_bytes.size() == 2u);
  BOOST_TEST((di->inline_bytes[0] == std::byte{9}));
  // Bytes after the meta of an entry that is not inline.
  BOOST_TEST((decode_entry_begin(with, false, 16, 16).code() == errc::protocol_violation));
  BOOST_TEST((decode_entry_begin(p, false, 2, 16).code() == errc::protocol_violation));   // key
  BOOST_TEST((decode_entry_begin(p, false, 16, 2).code() == errc::protocol_violation));   // meta
  auto no_meta = encode_entry_begin("key", {});
  BOOST_TEST((decode_entry_begin(no_meta, false, 16, 16).code() == errc::protocol_violation));
  p[0] = std::byte{0xff};  // key length past the payload
  BOOST_TEST((decode_entry_begin(p, false, 1000, 16).code() == errc::protocol_violation));
  BOOST_TEST((decode_entry_begin(std::span(p).first(7), false, 16, 16).code() ==
              errc::protocol_violation));
}

BOOST_AUTO_TEST_CASE(entry_credit_counts_bytes_key_meta_and_bookkeeping) {
  BOOST_TEST(entry_credit(0, 0, 0) == entry_overhead_bytes);
  BOOST_TEST(entry_credit(1000, 10, 30) == 1000u + 10 + 30 + entry_overhead_bytes);
}

BOOST_AUTO_TEST_CASE(frame_type_names_are_stable) {
  const std::pair<frame_type, std::string_view> names[] = {
      {frame_type::hello, "hello"},         {frame_type::blob_begin, "blob_begin"},
      {frame_type::entry_begin, "entry_begin"}, {frame_type::data, "data"},
      {frame_type::tail, "tail"},           {frame_type::blob_abort, "blob_abort"},
      {frame_type::ack, "ack"},             {frame_type::close, "close"},
  };
  for (const auto& [type, name] : names) {
    const char* got = frame_type_name(type);
    BOOST_TEST_REQUIRE(got != nullptr, name);
    BOOST_TEST(std::string_view(got) == name);
  }
  BOOST_TEST(frame_type_name(static_cast<frame_type>(77)) == std::string("unknown"));
}

BOOST_AUTO_TEST_CASE(an_outbox_keeps_its_bytes_as_it_grows_and_moves) {
  // append() grows its memory without zeroing it: every growth must carry
  // the bytes queued so far, and a moved-from outbox is empty and usable.
  outbox o;
  std::vector<std::byte> expect;
  for (std::size_t n = 1; n <= 300; ++n) {
    auto room = o.append(n);
    BOOST_TEST(room.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      room[i] = static_cast<std::byte>(n * 7 + i);
      expect.push_back(room[i]);
    }
  }
  const auto same = [](const outbox& b, std::span<const std::byte> want) {
    if (b.pieces().size() != 1) return false;
    const auto got = b.pieces()[0].bytes(b);
    return std::equal(got.begin(), got.end(), want.begin(), want.end());
  };
  BOOST_TEST(o.copied_bytes() == expect.size());
  BOOST_TEST(o.size() == expect.size());
  BOOST_TEST(same(o, expect));

  outbox moved(std::move(o));
  BOOST_TEST(same(moved, expect));
  BOOST_TEST(o.empty());
  BOOST_TEST(o.size() == 0u);
  BOOST_TEST(o.copied_bytes() == 0u);
  const std::array<std::byte, 3> three{std::byte{1}, std::byte{2}, std::byte{3}};
  std::memcpy(o.append(3).data(), three.data(), 3);
  BOOST_TEST(same(o, three));

  o = std::move(moved);
  BOOST_TEST(same(o, expect));
  BOOST_TEST(moved.empty());
  BOOST_TEST(moved.copied_bytes() == 0u);
  o.clear();
  BOOST_TEST(o.empty());
  std::memcpy(o.append(3).data(), three.data(), 3);
  BOOST_TEST(same(o, three));
}
