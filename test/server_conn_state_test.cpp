// lib/cluster/conn_lifecycle.hpp (internal): a fan-in server connection's
// life. Every legal transition is taken and counted (live, closing), and an
// illegal one is refused: the state stays, the counts stay, illegal() counts
// it. No sockets: the state machine alone.
#define BOOST_TEST_MODULE server_conn_state_test
#include <boost/test/unit_test.hpp>

#include <array>

#include "lib/cluster/conn_lifecycle.hpp"

using blobpipe::detail::conn_lifecycle;
using blobpipe::detail::conn_state;
using blobpipe::detail::holds_slot;
using blobpipe::detail::transition_allowed;

namespace {
constexpr std::array all_states{conn_state::handshaking, conn_state::open, conn_state::closing,
                                conn_state::ended};
}  // namespace

BOOST_AUTO_TEST_CASE(a_connection_that_opens_and_ends_holds_a_slot_until_it_ends) {
  conn_lifecycle life;
  conn_state s = life.admit();
  BOOST_TEST((s == conn_state::handshaking));
  BOOST_TEST(life.live() == 1u);
  BOOST_TEST(life.move(s, conn_state::open));
  BOOST_TEST(life.live() == 1u);
  BOOST_TEST(life.move(s, conn_state::ended));
  BOOST_TEST((s == conn_state::ended));
  BOOST_TEST(life.live() == 0u);
  BOOST_TEST(life.closing() == 0u);
  BOOST_TEST(life.illegal() == 0u);
}

BOOST_AUTO_TEST_CASE(a_failed_or_reclaimed_handshake_ends_and_frees_its_slot) {
  conn_lifecycle life;
  conn_state s = life.admit();
  BOOST_TEST(life.move(s, conn_state::ended));
  BOOST_TEST(life.live() == 0u);
  BOOST_TEST(life.illegal() == 0u);
}

BOOST_AUTO_TEST_CASE(a_reclaimed_idle_connection_frees_its_slot_but_counts_as_closing_until_it_ends) {
  conn_lifecycle life;
  conn_state a = life.admit();
  conn_state b = life.admit();
  BOOST_TEST(life.live() == 2u);
  BOOST_TEST(life.move(a, conn_state::open));
  BOOST_TEST(life.move(a, conn_state::closing));
  BOOST_TEST(life.live() == 1u);  // its slot is free for another
  BOOST_TEST(life.closing() == 1u);  // but its events are still coming
  BOOST_TEST(life.move(a, conn_state::ended));
  BOOST_TEST(life.live() == 1u);
  BOOST_TEST(life.closing() == 0u);
  BOOST_TEST((b == conn_state::handshaking));
  BOOST_TEST(life.illegal() == 0u);
}

BOOST_AUTO_TEST_CASE(an_illegal_transition_is_refused_and_counted_leaving_state_and_counts) {
  conn_lifecycle life;
  conn_state s = life.admit();
  // Straight from the handshake to closing: only an open connection is
  // reclaimed as idle.
  BOOST_TEST(!life.move(s, conn_state::closing));
  BOOST_TEST((s == conn_state::handshaking));
  BOOST_TEST(life.live() == 1u);
  BOOST_TEST(life.closing() == 0u);
  BOOST_TEST(life.illegal() == 1u);
  BOOST_TEST(life.move(s, conn_state::ended));
  // Nothing leaves ended: ending twice would count a slot out twice.
  BOOST_TEST(!life.move(s, conn_state::ended));
  BOOST_TEST(!life.move(s, conn_state::open));
  BOOST_TEST((s == conn_state::ended));
  BOOST_TEST(life.live() == 0u);
  BOOST_TEST(life.illegal() == 3u);
}

BOOST_AUTO_TEST_CASE(only_the_documented_arrows_are_allowed) {
  int allowed = 0;
  for (conn_state from : all_states)
    for (conn_state to : all_states)
      if (transition_allowed(from, to)) ++allowed;
  BOOST_TEST(allowed == 5);
  BOOST_TEST(transition_allowed(conn_state::handshaking, conn_state::open));
  BOOST_TEST(transition_allowed(conn_state::handshaking, conn_state::ended));
  BOOST_TEST(transition_allowed(conn_state::open, conn_state::closing));
  BOOST_TEST(transition_allowed(conn_state::open, conn_state::ended));
  BOOST_TEST(transition_allowed(conn_state::closing, conn_state::ended));
  // No way back, and no state moves to itself.
  BOOST_TEST(!transition_allowed(conn_state::open, conn_state::handshaking));
  BOOST_TEST(!transition_allowed(conn_state::closing, conn_state::open));
  for (conn_state st : all_states) BOOST_TEST(!transition_allowed(st, st));
  BOOST_TEST(holds_slot(conn_state::handshaking));
  BOOST_TEST(holds_slot(conn_state::open));
  BOOST_TEST(!holds_slot(conn_state::closing));
  BOOST_TEST(!holds_slot(conn_state::ended));
}
