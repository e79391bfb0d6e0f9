// test/cluster_fixture.hpp — scaffolding for the fan-in server and router
// tests: senders that stream numbered blobs to a URL, and a record of what a
// server yielded (kinds, connections, tags, groups), without holding the
// entries (so their credit goes back at once). Every entry's bytes are
// distinct per sender, blob, entry and position (fixture_bytes), and the
// record checks them, so entries swapped within a blob, or blobs swapped,
// show as bytes_ok false.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "blobpipe/cluster/server.hpp"
#include "blobpipe/transport/url.hpp"
#include "test/pipeline_fixture.hpp"

namespace blobpipe::testing {

/// A tag naming sender `who`'s blob `k` (never NO_TAG).
inline tag_t numbered_tag(std::uint32_t who, std::uint32_t k) {
  tag_t t{};
  t.fill(std::byte{0x5A});
  std::memcpy(t.data(), &who, 4);
  std::memcpy(t.data() + 4, &k, 4);
  return t;
}
inline std::uint32_t tag_sender(const tag_t& t) {
  std::uint32_t who;
  std::memcpy(&who, t.data(), 4);
  return who;
}

/// The bytes of entry `e` (key "e<e>") of sender `who`'s blob `k`: `n`
/// bytes, byte i = who * 158 + k * 59 + e * 23 + i + i / 256 (mod 256), so
/// two entries of one blob, the same entry of two blobs and two senders'
/// blobs differ in every byte.
inline std::vector<std::uint8_t> fixture_bytes(std::uint32_t who, std::uint32_t k,
                                               std::size_t e, std::size_t n) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::uint8_t>(who * 158u + k * 59u + e * 23u + i + (i >> 8));
  return v;
}

/// What sender `who` streams: `blobs` blobs of `entries` uint8 entries of
/// `bytes` bytes each; entry e of blob k holds fixture_bytes(who, k, e, bytes).
struct stream_plan {
  std::uint32_t who = 0;
  int blobs = 1;
  int entries = 1;
  std::size_t bytes = 64;
  std::optional<blob_group> group;  // every blob in this group
};

/// Streams `p` through `s` (started); returns the first error.
inline asio::awaitable<std::error_code> stream_blobs(sender& s, stream_plan p) {
  for (int k = 0; k < p.blobs; ++k) {
    auto blob = s.open_blob(blob_options{.tag = numbered_tag(p.who, static_cast<std::uint32_t>(k)),
                                         .group = p.group});
    for (int e = 0; e < p.entries; ++e) {
      const auto bytes = fixture_bytes(p.who, static_cast<std::uint32_t>(k),
                                       static_cast<std::size_t>(e), p.bytes);
      if (auto ec = co_await blob.emit("e" + std::to_string(e), value::tensor(bytes))) co_return ec;
    }
    if (auto ec = co_await blob.finish()) co_return ec;
  }
  co_return std::error_code{};
}

/// Connects to `url` and starts a sender; connect's or the handshake's
/// error.
inline asio::awaitable<std::tuple<std::error_code, sender>> start_sender(std::string url,
                                                                         sender_options opt = {}) {
  auto ex = co_await asio::this_coro::executor;
  auto [ec, t] = co_await blobpipe::connect(ex, url);
  if (ec) co_return std::tuple{ec, sender{}};
  co_return co_await sender::start(std::move(t), opt);
}

/// Connects to `url`, streams `p`, shuts down in order; the first error.
inline asio::awaitable<std::error_code> send_to(std::string url, stream_plan p,
                                                sender_options opt = {}) {
  auto [sec, s] = co_await start_sender(std::move(url), opt);
  if (sec) co_return sec;
  if (auto e = co_await stream_blobs(s, p)) co_return e;
  co_return co_await s.shutdown();
}

/// One event a server yielded, without its entry.
struct seen {
  server_event_kind kind = server_event_kind::end_of_stream;
  std::uint64_t conn = 0;      // 0: none
  std::string peer;
  tag_t tag = NO_TAG;
  std::size_t bytes = 0;       // entry_ready: its length
  bool bytes_ok = true;        // entry_ready: key "e<index>", bytes fixture_bytes
  std::optional<blob_group> group;
  std::error_code error;
  bool resend = false;
  std::thread::id on = std::this_thread::get_id();  // the thread next() resumed on
};

inline seen record(const server_event& ev) {
  seen s;
  s.kind = ev.kind;
  if (ev.connection) {
    s.conn = ev.connection->id;
    s.peer = ev.connection->peer;
  }
  s.tag = ev.ev.tag;
  s.group = ev.ev.group;
  s.error = ev.ev.error;
  s.resend = ev.ev.resend;
  if (ev.kind == server_event_kind::entry_ready) {
    const auto b = ev.ev.entry->view.bytes;
    s.bytes = b.size();
    std::uint32_t who, k;
    std::memcpy(&who, ev.ev.tag.data(), 4);
    std::memcpy(&k, ev.ev.tag.data() + 4, 4);
    const std::size_t e = ev.ev.entry->index;
    const auto want = fixture_bytes(who, k, e, b.size());
    s.bytes_ok = ev.ev.entry->entry.key == "e" + std::to_string(e) &&
                 (want.empty() || std::memcmp(b.data(), want.data(), want.size()) == 0);
  }
  return s;
}

/// Takes a server's events until end_of_stream; stops accepting once
/// `connections` connections have closed.
inline asio::awaitable<std::vector<seen>> collect(server& srv, std::size_t connections) {
  std::vector<seen> out;
  std::size_t closed = 0;
  for (;;) {
    auto ev = co_await srv.next();
    out.push_back(record(ev));
    if (ev.kind == server_event_kind::connection_closed && ++closed == connections)
      srv.stop_accepting();
    if (ev.kind == server_event_kind::end_of_stream) co_return out;
  }
}

/// collect() into `out` (a coroutine function, so that r.spawn can take
/// it: its parameters live in its frame, unlike a temporary lambda's
/// captures).
inline asio::awaitable<void> collect_into(server& srv, std::size_t connections,
                                          std::vector<seen>& out) {
  out = co_await collect(srv, connections);
}

/// send_to() into `out`.
inline asio::awaitable<void> send_into(std::string url, stream_plan p, std::error_code& out,
                                       sender_options opt = {}) {
  out = co_await send_to(std::move(url), p, opt);
}

/// Whether every entry_ready in `v` carried its fixture_bytes under its key.
inline bool all_bytes_ok(const std::vector<seen>& v) {
  for (const auto& s : v)
    if (!s.bytes_ok) return false;
  return true;
}

inline std::size_t count(const std::vector<seen>& v, server_event_kind k) {
  std::size_t n = 0;
  for (const auto& s : v) n += s.kind == k;
  return n;
}

}  // namespace blobpipe::testing

namespace blobpipe {
inline std::ostream& operator<<(std::ostream& os, server_event_kind k) {
  const char* names[] = {"connection_opened", "entry_ready",   "blob_complete",
                         "blob_aborted",      "group_complete", "group_aborted",
                         "connection_closed", "end_of_stream"};
  return os << names[static_cast<int>(k)];
}
}  // namespace blobpipe
