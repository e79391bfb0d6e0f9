#include "lib/runtime/progress_clocks.hpp"

#include <algorithm>

namespace blobpipe::detail {

progress_clocks::progress_clocks(ms stall, ms idle, ms held)
    : stall_(stall), idle_(idle), held_(held) {
  ms shortest = ms::max();
  if (stall_.count() > 0) shortest = std::min(shortest, stall_);
  if (idle_.count() > 0) shortest = std::min(shortest, idle_);
  if (held_.count() > 0) shortest = std::min(shortest, held_);
  tick_ = std::max(ms(1), shortest / 4);
}

void progress_clocks::begin_wait(time_point now) noexcept {
  // The silence of a fresh wait counts from its start, not from the last
  // time bytes arrived (the application may have been busy in between);
  // the stall clock, from the last progress, less the time not waiting.
  if (waiting_++ != 0 || !enabled()) return;
  last_ = now;
  if (!counted_ || wait_ended_ == time_point{}) {
    advanced_ = now;
  } else {
    advanced_ = std::min(now, advanced_ + (now - wait_ended_));
  }
}

void progress_clocks::end_wait(time_point now) noexcept {
  if (waiting_ > 0 && --waiting_ == 0 && enabled()) wait_ended_ = now;
}

void progress_clocks::progress(std::uint64_t bytes, std::uint64_t items,
                               time_point now) noexcept {
  if (!enabled()) return;
  last_ = now;
  counted_ = true;
  if (items != items_mark_ || bytes - bytes_mark_ >= progress_bytes) {
    advanced_ = now;
    pressed_for_ = clock::duration::zero();
    items_mark_ = items;
    bytes_mark_ = bytes;
  }
}

std::optional<progress_clocks::limit_kind> progress_clocks::check(time_point now, bool pressed) {
  if (stopped_ || waiting_ == 0) {
    pressed_on_ = false;  // time not waiting is not counted as pressed
    return std::nullopt;
  }
  const auto silent = now - last_;
  const auto stuck = now - advanced_;
  if (idle_.count() > 0 && silent >= idle_) {
    tripped_ = limit_kind::idle;
    return tripped_;
  }
  if (stall_.count() > 0 && owes_ && stuck >= stall_) {
    tripped_ = limit_kind::stall;
    return tripped_;
  }
  // Pressed: holding credit others wait for. The time pressed adds up
  // from check to check until the next progress, so a pressure that comes
  // and goes (a waiting sender that reconnects) does not start it over.
  pressed = pressed && stall_.count() > 0;
  if (pressed && pressed_on_) pressed_for_ += now - std::max(pressed_seen_, advanced_);
  if (pressed) pressed_seen_ = now;
  pressed_on_ = pressed;
  if (pressed && pressed_for_ >= stall_) {
    tripped_ = limit_kind::pressed;
    return tripped_;
  }
  // Held: silent since the application began holding what blocks it.
  if (held_.count() > 0 && held_on_ && now - std::max(last_, held_since_) >= held_) {
    tripped_ = limit_kind::held;
    return tripped_;
  }
  return std::nullopt;
}

}  // namespace blobpipe::detail
