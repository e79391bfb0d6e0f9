// test/ucx_links.hpp — the UCX configurations the UCX tests run over, and a
// connected pair of UCX transports on one io_context (the UCX counterpart
// of pipeline_fixture.hpp's raw_pair).
//
// Each configuration names UCX_TLS through blobpipe::ucx::options (so tests
// need no setenv) and the transport UCX must select for it. A test first
// asks offered(): when UCX itself reports that this machine has no such
// transport (it lists it nowhere, as ucx_info -d would not: cma is left out
// under a strict ptrace scope, for one), the case skips, saying why, before
// anything runs. Otherwise the transport must be selected: ucx_pair() fails
// when UCX chose another. (tcp stays in every list, as applications had it
// when UCX's sockaddr connection manager set connections up; blobpipe's
// own rendezvous needs none: ucx_listener_test connects with UCX_TLS=sm.)
#pragma once

#include <memory>
#include <ostream>
#include <set>
#include <stdexcept>
#include <system_error>
#include <string>
#include <utility>
#include <vector>

#include <asio/this_coro.hpp>

#include "blobpipe/transport/ucx.hpp"
#include "test/skip.hpp"

namespace blobpipe::testing {

struct ucx_link {
  std::string name;
  ucx::options opt;
  std::string lane;  ///< text ucp_ep_print_info must show, e.g. "posix/memory"
};

inline std::ostream& operator<<(std::ostream& os, const ucx_link& l) { return os << l.name; }

/// tcp alone, then each shared-memory transport on loopback (with tcp
/// beside it), then UCX's "sm" alias (sysv + cma here).
inline const std::vector<ucx_link>& ucx_links() {
  static const std::vector<ucx_link> links = {
      {"tcp", {{{"TLS", "tcp"}}}, "tcp/lo"},
      {"posix", {{{"TLS", "posix,tcp"}}}, "posix/memory"},
      {"sysv", {{{"TLS", "sysv,tcp"}}}, "sysv/memory"},
      {"cma", {{{"TLS", "cma,tcp"}}}, "cma/memory"},
      {"sm", {{{"TLS", "sm,tcp"}}}, "/memory"},
  };
  return links;
}

/// The transports UCX finds on this machine ("tcp", "posix", ...), as
/// ucx_info -d lists them (test/ucx_links.cpp).
const std::set<std::string>& ucx_transports_here();

/// Whether this machine can offer the link's transport at all (UCX lists
/// it: for "sm", one of posix, sysv and cma); otherwise `why` says so.
inline bool offered(const ucx_link& l, std::string& why) {
  const auto& here = ucx_transports_here();
  const std::string tl = l.lane.substr(0, l.lane.find('/'));
  const std::vector<std::string> wanted =
      tl.empty() ? std::vector<std::string>{"posix", "sysv", "cma"} : std::vector{tl};
  for (const auto& w : wanted)
    if (here.count(w)) return true;
  std::string listed;
  for (const auto& h : here) listed += (listed.empty() ? "" : ",") + h;
  why = "ucx/" + l.name + ": UCX offers no " + (tl.empty() ? "shared-memory" : tl) +
        " transport on this machine (it lists: " + (listed.empty() ? "none" : listed) + ")";
  return false;
}

/// In a Boost.Test case: skips it (a SKIPPED line, test/skip.hpp) when UCX
/// reports that this machine has no transport for `link` (a ucx_link).
/// Call it first, before anything runs.
#define BLOBPIPE_SKIP_UNLESS_OFFERED(link)                                \
  do {                                                                    \
    std::string blobpipe_offer_why_;                                      \
    if (!::blobpipe::testing::offered((link), blobpipe_offer_why_))       \
      BLOBPIPE_SKIP(blobpipe_offer_why_);                                 \
  } while (0)

/// Whether UCX selected `l.lane` for the endpoint of `t`; otherwise
/// `why` says what it selected instead.
inline bool selected(const ucx_link& l, const transport& t, std::string& why) {
  auto d = ucx::describe(t);
  if (!d) {
    why = d.message();
    return false;
  }
  if (d->find(l.lane) != std::string::npos) return true;
  why = "UCX did not select " + l.lane + " for UCX_TLS=" + l.opt.config[0].second +
        " on this machine; its endpoint:\n" + *d;
  return false;
}

/// Two connected UCX transports on the current executor (a: connected,
/// b: accepted). Throws when UCX did not select the link's transport for
/// them: the connected end's lanes are final once connect() returns (it
/// flushed the endpoint, which waits for the wireup).
inline asio::awaitable<std::pair<std::unique_ptr<transport>, std::unique_ptr<transport>>> ucx_pair(
    const ucx_link& l, transport_options opt = {}) {
  auto ex = co_await asio::this_coro::executor;
  auto lis = ucx::listen(ex, 0, "127.0.0.1", l.opt).value();
  auto [cec, connected] = co_await ucx::connect(ex, "127.0.0.1", lis.port(), opt, l.opt);
  if (cec) throw std::runtime_error("ucx connect: " + cec.message());
  if (std::string why; !selected(l, *connected, why)) throw std::runtime_error("ucx_pair: " + why);
  // The listener took the request already: accept does not wait for it.
  auto [aec, accepted] = co_await lis.accept(opt);
  if (aec) throw std::runtime_error("ucx accept: " + aec.message());
  co_return std::pair{std::move(connected), std::move(accepted)};
}

}  // namespace blobpipe::testing
