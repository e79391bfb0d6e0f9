// libFuzzer entry point: a whole consumer fed arbitrary bytes as its
// connection (decoder_fuzz drives the push decoder alone).
//
// The input is a byte stream as a TCP socket would deliver it, through a
// replay byte transport, so the consumer's I/O loop and sinks on top of
// the decoder — handshake, entry destinations, memory assembly, window
// credit, tails, aborts, resend-session duplicates — run on untrusted
// bytes. Byte 0 picks
// options: bit 0 prepends a valid sender hello (bit 1: with a resend
// session), bit 2 assembles blobs in memory, bit 3 holds every entry until
// its blob ends, bit 5 has that hello offer compact entries (which the
// consumer accepts by default). In every mode: no entry is yielded twice; a blob reported
// complete had each of its index's entries yielded exactly once, each as
// its row says (in memory mode, with the bytes the assembled blob holds at
// its offset); and it reads back with read_index (memory mode).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include "blobpipe/pipeline.hpp"

#include "fuzz/stream_input.hpp"

namespace {

using namespace blobpipe;

/// A byte transport whose peer is a fixed byte string (writes are
/// dropped), delivered in reads of at most 1000 bytes.
class replay_transport final : public transport {
 public:
  replay_transport(asio::any_io_executor ex, std::span<const std::byte> bytes)
      : ex_(std::move(ex)), in_(bytes) {}
  asio::any_io_executor get_executor() const override { return ex_; }
  asio::awaitable<std::error_code> write(std::span<const asio::const_buffer>) override {
    co_return closed_ ? make_error_code(errc::closed) : std::error_code{};
  }
  asio::awaitable<std::tuple<std::error_code, read_result>> read_some(
      std::span<std::byte> buf) override {
    if (closed_ || in_.empty()) {
      closed_ = true;
      co_return std::tuple{make_error_code(errc::peer_closed), read_result{}};
    }
    const std::size_t n = std::min({buf.size(), in_.size(), std::size_t{1000}});
    std::memcpy(buf.data(), in_.data(), n);
    in_ = in_.subspan(n);
    co_return std::tuple{std::error_code{}, read_result{n, 0}};
  }
  asio::awaitable<std::error_code> read_exact(std::span<std::byte> dest) override {
    if (closed_ || in_.size() < dest.size()) {
      closed_ = true;
      co_return make_error_code(errc::peer_closed);
    }
    std::memcpy(dest.data(), in_.data(), dest.size());
    in_ = in_.subspan(dest.size());
    co_return std::error_code{};
  }
  void close() noexcept override { closed_ = true; }
  bool is_open() const noexcept override { return !closed_; }

 private:
  asio::any_io_executor ex_;
  std::span<const std::byte> in_;
  bool closed_ = false;
};

void check_complete(const completed_blob& b,
                    const std::vector<std::shared_ptr<const received_entry>>& seen,
                    bool memory) {
  for (const auto& e : seen)
    if (e->index >= b.index.entries.size() || !(b.index.entries[e->index] == e->entry))
      __builtin_trap();
  if (!memory) return;
  auto again = read_index(b.bytes);
  if (!again || again->entries != b.index.entries) __builtin_trap();
}

/// What was yielded of one open blob: each entry's row, and in memory mode
/// a copy of its bytes.
struct yielded {
  std::map<std::size_t, Entry> rows;
  std::map<std::size_t, std::vector<std::byte>> bytes;
};

/// Every entry of a completed blob was yielded once, as its row says.
void check_yielded_once(const completed_blob& b, const yielded& y, bool memory) {
  const auto& rows = b.index.entries;
  if (y.rows.size() != rows.size()) __builtin_trap();  // one missing (none is twice)
  for (const auto& [i, row] : y.rows)
    if (i >= rows.size() || !(rows[i] == row)) __builtin_trap();
  if (!memory) return;
  for (const auto& [i, bytes] : y.bytes) {
    const Entry& row = rows[i];
    if (row.off + row.len > b.bytes.size() || bytes.size() != row.len ||
        (row.len != 0 && std::memcmp(b.bytes.data() + row.off, bytes.data(), row.len) != 0))
      __builtin_trap();
  }
}

asio::awaitable<void> consume(std::unique_ptr<transport> t, consumer_options opt, bool hold) {
  auto [ec, c] = co_await consumer::start(std::move(t), opt);
  if (ec) co_return;
  const bool memory = opt.assemble == assemble_mode::memory;
  std::vector<std::shared_ptr<const received_entry>> held;
  std::map<std::uint64_t, yielded> open;
  for (;;) {
    auto ev = co_await c.next();
    if (ev.kind == event_kind::end_of_stream) break;
    if (ev.kind == event_kind::entry_ready) {
      const auto& e = *ev.entry;
      if (e.view.bytes.size() != e.entry.len || e.view.entry != &e.entry) __builtin_trap();
      if (e.blob_id != ev.blob_id) __builtin_trap();
      yielded& y = open[ev.blob_id];
      if (!y.rows.emplace(e.index, e.entry).second) __builtin_trap();  // yielded twice
      if (memory) y.bytes[e.index].assign(e.view.bytes.begin(), e.view.bytes.end());
      if (hold) held.push_back(ev.entry);
    } else if (ev.kind == event_kind::blob_complete) {
      std::vector<std::shared_ptr<const received_entry>> mine;
      for (auto& h : held)
        if (h->blob_id == ev.blob_id) mine.push_back(h);
      check_complete(*ev.blob, mine, memory);
      check_yielded_once(*ev.blob, open[ev.blob_id], memory);
      open.erase(ev.blob_id);
      std::erase_if(held, [&](auto& h) { return h->blob_id == ev.blob_id; });
    } else {
      open.erase(ev.blob_id);
      std::erase_if(held, [&](auto& h) { return h->blob_id == ev.blob_id; });
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  std::optional<hello> h;
  if (mode & 1) {
    h = hello{.role = wire_role::sender, .max_chunk_bytes = 4096};
    if (mode & 2) h->session[0] = std::byte{1};
    if (mode & 32) h->features = feature_compact_entries;
  }
  const std::vector<std::byte> stream = fuzzing::stream_input(h, std::span(data + 1, size - 1));

  consumer_options opt;
  opt.window_bytes = 1 << 20;
  opt.max_chunk_bytes = 4096;
  opt.max_entry_bytes = 1 << 20;
  opt.max_blob_bytes = 1 << 20;
  opt.max_tail_bytes = 1 << 16;
  opt.max_open_blobs = 16;
  opt.max_entries_per_blob = 1024;
  opt.assemble = (mode & 4) ? assemble_mode::memory : assemble_mode::none;
  // A fresh log per input: runs must not depend on each other.
  opt.delivered = std::make_shared<delivery_log>(64, 4);

  asio::io_context ctx;
  auto t = std::make_unique<replay_transport>(ctx.get_executor(), stream);
  asio::co_spawn(ctx, consume(std::move(t), std::move(opt), (mode & 8) != 0), asio::detached);
  ctx.run();
  return 0;
}
