// A fan-in server connection's life as seen from home (internal): one
// state, changed only by conn_lifecycle::move, which refuses a transition
// the life does not allow and keeps the server's counts of live and
// closing connections, so that they follow from the states and nowhere
// else.
//
//   handshaking ──> open ──> closing ──> ended
//        │            │                    ▲
//        └────────────┴────────────────────┘
//
//   handshaking: accepted, its hello not yet exchanged; holds a slot.
//   open:        its handshake finished (connection_opened); holds a slot.
//   closing:     reclaimed as idle; its slot is free, but its events (its
//                connection_closed last) are still coming, so next() does
//                not end yet.
//   ended:       its stream ended, its handshake failed, or its slot was
//                reclaimed during the handshake (whatever it still sends is
//                dropped). No way out.
//
// An illegal transition is a bug in the server, not a peer's doing: move()
// refuses it (the state stays as it was), counts it in illegal() and
// returns false. The server asserts on it in debug builds (the tests), and
// in release goes on, so that a bug there cannot take down a rank that
// serves other connections (server_state::move).
#pragma once

#include <cstdint>

namespace blobpipe::detail {

enum class conn_state : std::uint8_t { handshaking, open, closing, ended };

/// Whether a connection in `s` holds a slot (server_options::max_connections).
constexpr bool holds_slot(conn_state s) noexcept {
  return s == conn_state::handshaking || s == conn_state::open;
}

/// Whether `from` may become `to`: the arrows above.
constexpr bool transition_allowed(conn_state from, conn_state to) noexcept {
  switch (from) {
    case conn_state::handshaking: return to == conn_state::open || to == conn_state::ended;
    case conn_state::open: return to == conn_state::closing || to == conn_state::ended;
    case conn_state::closing: return to == conn_state::ended;
    case conn_state::ended: return false;
  }
  return false;
}

/// The server's connections' states, counted (home only).
class conn_lifecycle {
 public:
  /// A connection accepted: it starts handshaking, taking a slot.
  [[nodiscard]] conn_state admit() noexcept {
    ++live_;
    return conn_state::handshaking;
  }
  /// Moves `state` to `to` if transition_allowed; whether it did. Refused:
  /// `state` unchanged, illegal() counts it.
  bool move(conn_state& state, conn_state to) noexcept {
    if (!transition_allowed(state, to)) {
      ++illegal_;
      return false;
    }
    if (holds_slot(state) && !holds_slot(to)) --live_;
    if (state == conn_state::closing) --closing_;
    if (to == conn_state::closing) ++closing_;
    state = to;
    return true;
  }
  /// Connections handshaking or open: those holding a slot.
  std::uint64_t live() const noexcept { return live_; }
  /// Connections closing: reclaimed, their events still coming.
  std::uint64_t closing() const noexcept { return closing_; }
  /// Transitions refused (a bug when not 0).
  std::uint64_t illegal() const noexcept { return illegal_; }

 private:
  std::uint64_t live_ = 0;
  std::uint64_t closing_ = 0;
  std::uint64_t illegal_ = 0;
};

}  // namespace blobpipe::detail
