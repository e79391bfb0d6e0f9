// Frame codec (blobpipe/wire.hpp): headers, hello, entry_begin payloads.
#define BOOST_TEST_MODULE wire
#include <boost/test/unit_test.hpp>

#include <array>

#include "blobpipe/protocol/wire.hpp"

using namespace blobpipe;

BOOST_AUTO_TEST_CASE(frame_header_round_trips_little_endian) {
  const frame_header h{.type = frame_type::data, .length = 0x01020304, .blob_id = 7,
                       .arg = 0x1122334455667788ull};
  std::array<std::byte, frame_header_size> buf;
  encode_frame_header(h, buf);
  BOOST_TEST(static_cast<int>(buf[0]) == 4);
  BOOST_TEST(static_cast<int>(buf[4]) == 0x04);  // length, little-endian
  BOOST_TEST(static_cast<int>(buf[16]) == 0x88);
  auto d = decode_frame_header(buf, default_max_frame_bytes);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST((*d == h));
}

BOOST_AUTO_TEST_CASE(frame_header_rejects_unknown_type_flags_and_oversized_length) {
  std::array<std::byte, frame_header_size> buf;
  encode_frame_header({.type = frame_type::ack}, buf);
  auto bad = buf;
  bad[0] = std::byte{0};
  BOOST_TEST((decode_frame_header(bad, 1024).code() == errc::protocol_violation));
  bad[0] = std::byte{9};
  BOOST_TEST((decode_frame_header(bad, 1024).code() == errc::protocol_violation));
  bad = buf;
  bad[1] = std::byte{1};
  BOOST_TEST((decode_frame_header(bad, 1024).code() == errc::protocol_violation));
  bad = buf;
  bad[3] = std::byte{1};
  BOOST_TEST((decode_frame_header(bad, 1024).code() == errc::protocol_violation));
  encode_frame_header({.type = frame_type::tail, .length = 1025}, buf);
  BOOST_TEST((decode_frame_header(buf, 1024).code() == errc::protocol_violation));
  BOOST_TEST(decode_frame_header(buf, 1025).has_value());
  BOOST_TEST((decode_frame_header(std::span(buf).first(23), 1025).code() == errc::too_small));
}

BOOST_AUTO_TEST_CASE(hello_round_trips_and_rejects_bad_magic_version_role_chunk) {
  session_id sid{};
  sid[0] = std::byte{0xAB};
  sid[15] = std::byte{0xCD};
  const hello h{.role = wire_role::consumer, .max_chunk_bytes = 4096, .max_key_bytes = 99,
                .window_bytes = 1ull << 40, .max_meta_bytes = 512, .dedup_window = 777,
                .session = sid};
  auto p = encode_hello(h);
  BOOST_TEST(p.size() == hello_size);
  auto d = decode_hello(p);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST((*d == h));
  auto bad = p;
  bad[0] = std::byte{0};
  BOOST_TEST((decode_hello(bad).code() == errc::protocol_violation));
  bad = p;
  bad[4] = std::byte{1};  // version 1: refused by name, before its size
  BOOST_TEST((decode_hello(bad).code() == errc::protocol_violation));
  BOOST_TEST(decode_hello(std::span(bad).first(32)).message().find("version 1") !=
             std::string::npos);
  bad = p;
  bad[4] = std::byte{3};  // a newer version
  BOOST_TEST((decode_hello(bad).code() == errc::protocol_violation));
  bad = p;
  bad[6] = std::byte{3};  // role 3
  BOOST_TEST((decode_hello(bad).code() == errc::protocol_violation));
  auto small = encode_hello({.max_chunk_bytes = 63});
  BOOST_TEST((decode_hello(small).code() == errc::protocol_violation));
  BOOST_TEST((decode_hello(std::span(p).first(31)).code() == errc::protocol_violation));
  BOOST_TEST((decode_hello(std::span(p).first(47)).code() == errc::protocol_violation));
  BOOST_TEST((decode_hello(std::span(p).first(4)).code() == errc::protocol_violation));
}

BOOST_AUTO_TEST_CASE(entry_begin_splits_key_and_meta_within_limits) {
  const std::array<std::byte, 3> meta{std::byte{0x85}, std::byte{1}, std::byte{2}};
  auto p = encode_entry_begin("key", meta);
  auto d = decode_entry_begin(p, 16, 16);
  BOOST_TEST_REQUIRE(d.has_value());
  BOOST_TEST(d->key == "key");
  BOOST_TEST(d->meta.size() == 3u);
  BOOST_TEST((decode_entry_begin(p, 2, 16).code() == errc::protocol_violation));   // key
  BOOST_TEST((decode_entry_begin(p, 16, 2).code() == errc::protocol_violation));   // meta
  auto no_meta = encode_entry_begin("key", {});
  BOOST_TEST((decode_entry_begin(no_meta, 16, 16).code() == errc::protocol_violation));
  p[0] = std::byte{0xff};  // key length past the payload
  BOOST_TEST((decode_entry_begin(p, 1000, 16).code() == errc::protocol_violation));
  BOOST_TEST((decode_entry_begin(std::span(p).first(3), 16, 16).code() == errc::protocol_violation));
}

BOOST_AUTO_TEST_CASE(frame_type_names_are_stable) {
  BOOST_TEST(frame_type_name(frame_type::entry_begin) == std::string("entry_begin"));
  BOOST_TEST(frame_type_name(static_cast<frame_type>(77)) == std::string("unknown"));
}
