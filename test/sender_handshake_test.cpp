// The sender's checks of the consumer's hello (docs/wire.md "Handshake": "at
// the sender also: a chunk or inline threshold above its proposal, a feature
// accepted that was not offered, and, with a session, a reply whose session
// differs or whose dedup_window is 0"; and a zero window). A scripted
// consumer answers the sender's hello with a reply that differs from a valid
// one in exactly one field; the valid reply starts the sender, and each
// altered one fails sender::start with protocol_violation, so the refusal is
// the one that field's check makes.
#define BOOST_TEST_MODULE sender_handshake_test
#include <boost/test/unit_test.hpp>

#include <functional>

#include "test/pipeline_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

using alter_fn = std::function<void(hello& reply, const hello& offer)>;

/// The valid reply to `offer`: negotiated chunk and inline, a window,
/// the session echoed with a delivery window, every offered feature but
/// credit grants (which would need credit to start with).
hello valid_reply(const hello& offer) {
  hello r{.role = wire_role::consumer};
  r.max_chunk_bytes = std::min<std::uint32_t>(offer.max_chunk_bytes, 1u << 20);
  r.inline_bytes = std::min<std::uint32_t>(offer.inline_bytes, 1u << 10);
  r.window_bytes = 1u << 20;
  r.session = offer.session;
  r.dedup_window = offer.session != NO_SESSION ? 4096 : 0;
  r.features = offer.features & ~feature_credit_grants;
  return r;
}

/// Plays a consumer on `t`: reads the sender's hello, answers with the
/// valid reply altered by `alter`, then reads until the sender hangs up.
asio::awaitable<void> scripted_consumer(std::unique_ptr<transport> t, alter_fn alter,
                                        hello& offer_seen) {
  frame_reader in;
  auto [ec, f] = co_await in.next(*t);
  BOOST_TEST_REQUIRE(!ec, "reading the sender's hello: " << ec.message());
  BOOST_TEST_REQUIRE((f.header.type == frame_type::hello));
  auto offer = decode_hello(f.payload);
  BOOST_TEST_REQUIRE(offer.has_value());
  offer_seen = *offer;
  hello reply = valid_reply(*offer);
  alter(reply, *offer);
  (void)co_await send_frame(*t, {.type = frame_type::hello}, encode_hello(reply));
  for (;;) {
    auto [rec, g] = co_await in.next(*t);
    if (rec) break;
  }
}

/// sender::start on `t` (plain) or through `connect` (a resend session,
/// one attempt); its error into `out` and its failure_reason() into
/// `reason`; then closes it.
asio::awaitable<void> start_sender(std::unique_ptr<transport> t, connect_fn connect,
                                   std::error_code& out, std::string& reason) {
  sender_options opt{.chunk_bytes = 4096, .inline_bytes = 256};
  opt.resend.max_attempts = 1;
  // Two statements, not `connect ? co_await a : co_await b`: GCC 12
  // evaluates co_await inside a conditional wrongly.
  std::tuple<std::error_code, sender> started;
  if (connect) {
    started = co_await sender::start(std::move(connect), opt);
  } else {
    started = co_await sender::start(std::move(t), opt);
  }
  auto& [ec, s] = started;
  out = ec;
  reason = s.failure_reason();
  s.close();
}

/// sender::start against the scripted consumer: its error, and its
/// failure_reason() into `reason` when given.
std::error_code start_against(alter_fn alter, bool session = false,
                              std::string* reason = nullptr) {
  runner r;
  std::error_code out;
  std::string why;
  hello offer;
  if (!session) {
    auto [a, b] = loopback::make_pair(r.ex());
    r.spawn(scripted_consumer(std::move(b), alter, offer));
    r.spawn(start_sender(std::move(a), nullptr, out, why));
  } else {
    auto ex = r.ex();
    connect_fn connect = [ex, alter, &offer, &r]()
        -> asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> {
      auto [a, b] = loopback::make_pair(ex);
      r.spawn(scripted_consumer(std::move(b), alter, offer));
      co_return std::tuple{std::error_code{}, std::move(a)};
    };
    r.spawn(start_sender(nullptr, std::move(connect), out, why));
  }
  BOOST_TEST_REQUIRE(r.run());
  if (reason) *reason = why;
  return out;
}

const alter_fn unchanged = [](hello&, const hello&) {};

}  // namespace

BOOST_AUTO_TEST_CASE(a_valid_reply_starts_the_sender) {
  const auto ec = start_against(unchanged);
  BOOST_TEST(!ec, ec.message());
  const auto sec = start_against(unchanged, true);
  BOOST_TEST(!sec, sec.message());
}

BOOST_AUTO_TEST_CASE(a_chunk_above_the_proposal_is_refused) {
  const auto ec = start_against([](hello& r, const hello& o) { r.max_chunk_bytes = o.max_chunk_bytes + 1; });
  BOOST_TEST((ec == errc::protocol_violation), ec.message());
  // The proposal itself is accepted.
  const auto at = start_against([](hello& r, const hello& o) { r.max_chunk_bytes = o.max_chunk_bytes; });
  BOOST_TEST(!at, at.message());
}

BOOST_AUTO_TEST_CASE(an_inline_threshold_above_the_proposal_is_refused) {
  const auto ec = start_against([](hello& r, const hello& o) { r.inline_bytes = o.inline_bytes + 1; });
  BOOST_TEST((ec == errc::protocol_violation), ec.message());
  const auto at = start_against([](hello& r, const hello& o) { r.inline_bytes = o.inline_bytes; });
  BOOST_TEST(!at, at.message());
}

BOOST_AUTO_TEST_CASE(a_zero_window_is_refused) {
  const auto ec = start_against([](hello& r, const hello&) { r.window_bytes = 0; });
  BOOST_TEST((ec == errc::protocol_violation), ec.message());
}

BOOST_AUTO_TEST_CASE(a_feature_accepted_that_was_not_offered_is_refused) {
  const auto ec = start_against([](hello& r, const hello& o) {
    // Bit 3 is never offered by this release.
    BOOST_TEST_REQUIRE((o.features & (1u << 3)) == 0u);
    r.features |= 1u << 3;
  });
  BOOST_TEST((ec == errc::protocol_violation), ec.message());
}

BOOST_AUTO_TEST_CASE(a_session_reply_with_another_session_or_no_delivery_log_is_refused) {
  const auto other = start_against([](hello& r, const hello&) { r.session[0] ^= std::byte{1}; }, true);
  BOOST_TEST((other == errc::protocol_violation), other.message());
  const auto no_log = start_against([](hello& r, const hello&) { r.dedup_window = 0; }, true);
  BOOST_TEST((no_log == errc::protocol_violation), no_log.message());
}

// A resend session that gives up on a consumer which answered and refused
// its hello says why, without the hint meant for a consumer never reached
// (lib/pipeline/resend.cpp give_up).
BOOST_AUTO_TEST_CASE(a_session_refused_at_the_hello_gives_up_without_the_listening_hint) {
  std::string reason;
  const auto ec = start_against([](hello& r, const hello&) { r.dedup_window = 0; }, true, &reason);
  BOOST_TEST((ec == errc::protocol_violation), ec.message());
  BOOST_TEST(reason.find("no handshake with the consumer on 1 connection attempts in a row") !=
                 std::string::npos,
             reason);
  BOOST_TEST(reason.find("keeps no delivery log") != std::string::npos, reason);
  BOOST_TEST(reason.find("is the consumer listening and accepting?") == std::string::npos, reason);
}

BOOST_AUTO_TEST_CASE(a_max_entry_bytes_extension_of_the_wrong_length_is_refused) {
  const auto short_value = start_against([](hello& r, const hello&) {
    r.extensions.push_back(hello_extension{.type = hello_ext_max_entry_bytes,
                                           .value = std::vector<std::byte>(4)});
  });
  BOOST_TEST((short_value == errc::protocol_violation), short_value.message());
  // Eight bytes is the extension; an unknown type of any length is skipped.
  const auto well_formed = start_against([](hello& r, const hello&) {
    r.extensions.push_back(max_entry_bytes_extension(1000));
    r.extensions.push_back(hello_extension{.type = 0x7fff, .value = std::vector<std::byte>(3)});
  });
  BOOST_TEST(!well_formed, well_formed.message());
}

// ---- after the handshake -------------------------------------------------------

namespace {

/// Plays a consumer that answers the hello validly and then, once the
/// sender's first blob_begin arrives, sends a frame only a sender may send
/// (a blob_begin), and reads until the sender hangs up.
asio::awaitable<void> consumer_breaking_the_protocol(std::unique_ptr<transport> t) {
  frame_reader in;
  auto [ec, f] = co_await in.next(*t);
  BOOST_TEST_REQUIRE(!ec, "reading the sender's hello: " << ec.message());
  auto offer = decode_hello(f.payload);
  BOOST_TEST_REQUIRE(offer.has_value());
  const frame_header reply_header{.type = frame_type::hello};
  const std::vector<std::byte> reply = encode_hello(valid_reply(*offer));
  (void)co_await send_frame(*t, reply_header, reply);
  bool sent = false;
  for (;;) {
    auto [rec, g] = co_await in.next(*t);
    if (rec) break;
    if (!sent && g.header.type == frame_type::blob_begin) {
      sent = true;
      const frame_header bad{.type = frame_type::blob_begin, .blob_id = 1};
      const std::vector<std::byte> tag(TAG_SIZE);
      (void)co_await send_frame(*t, bad, tag);
    }
  }
}

/// Starts a sender on `t`, sends one blob, and waits until the sender fails.
asio::awaitable<void> send_until_failed(std::unique_ptr<transport> t, std::error_code& out,
                                        std::string& reason) {
  sender_options opt{.chunk_bytes = 4096, .inline_bytes = 256};
  auto [ec, s] = co_await sender::start(std::move(t), opt);
  BOOST_TEST_REQUIRE(!ec, "start: " << ec.message());
  auto b = s.open_blob();
  const std::vector<float> x(8, 1.0f);
  std::string key = "x";
  value v = value::tensor(x);
  (void)co_await b.emit(std::move(key), std::move(v));
  (void)co_await b.finish();
  for (int i = 0; i < 100000 && !s.error(); ++i) co_await yield_n(1);
  out = s.error();
  reason = s.failure_reason();
  s.close();
}

}  // namespace

// docs/wire.md "Sender": a consumer's frame the sender refuses after the
// handshake (a blob_begin, which only a sender sends) fails the sender with
// protocol_violation, and failure_reason() names what broke.
BOOST_AUTO_TEST_CASE(a_consumer_breaking_the_protocol_after_the_handshake_fails_the_sender) {
  runner r;
  std::error_code ec;
  std::string why;
  auto [a, b] = loopback::make_pair(r.ex());
  r.spawn(consumer_breaking_the_protocol(std::move(b)));
  r.spawn(send_until_failed(std::move(a), ec, why));
  BOOST_TEST_REQUIRE(r.run());
  BOOST_TEST((ec == errc::protocol_violation), ec.message());
  BOOST_TEST(why.find("unexpected blob_begin frame from consumer") != std::string::npos, why);
}
