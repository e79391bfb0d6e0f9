// examples/rollout/reporting.hpp — coroutines that cannot lose an exception.
//
// A coroutine started with asio::detached drops the exception that ends
// it, and whatever it was holding (a consumer, a closer that points at it)
// is left to whoever looks next: the trainer used to segfault at its
// timeout that way. Every coroutine the examples start runs inside
// `reporting`, which hands such an exception to a callback as one line,
// in the same resumption, before anything that waits for the coroutine
// wakes:
//
//   asio::co_spawn(ex, rollout::reporting(consume(...), [&](std::string what) {
//     problems.add("connection 3: " + what);
//   }), asio::detached);
#pragma once

#include <exception>
#include <string>

#include <asio/awaitable.hpp>

namespace rollout {

/// The one-line text of an exception: what() for a std::exception.
inline std::string exception_text(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

/// Runs `a`; an exception that ends it goes to `on_exception` (its text)
/// instead of out of this coroutine. `a`'s locals are gone by then.
template <class OnException>
asio::awaitable<void> reporting(asio::awaitable<void> a, OnException on_exception) {
  std::exception_ptr failed;
  try {
    co_await std::move(a);
  } catch (...) {
    failed = std::current_exception();
  }
  if (failed) on_exception(exception_text(failed));
}

}  // namespace rollout
