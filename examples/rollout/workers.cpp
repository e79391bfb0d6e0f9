// examples/rollout/workers.cpp — see workers.hpp.
#include "examples/rollout/workers.hpp"

#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <sstream>

#include "examples/rollout/cpu.hpp"
#include "examples/rollout/error_text.hpp"
#include "examples/rollout/listener.hpp"

namespace rollout {
namespace {

using asio::experimental::as_tuple;
using blobpipe::errc;

constexpr auto retry_interval = std::chrono::milliseconds(100);

// A connected, started sender, or why not: the step that failed and the
// error as error_text prints it.
struct connected {
  std::error_code ec;
  blobpipe::sender sender;
  std::string step, why;
};

asio::awaitable<connected> connect_sender(asio::any_io_executor ex, const worker_config& cfg) {
  const std::string where = host_port(cfg.host, cfg.port);
  const auto give_up = std::chrono::steady_clock::now() + cfg.connect_patience;
  for (;;) {
    auto [ec, t] = co_await blobpipe::connect(ex, endpoint_url(cfg.transport, cfg.host, cfg.port));
    if (!ec) {
      blobpipe::sender_options opt;
      opt.stall_timeout = cfg.stall_timeout;
      auto [sec, s] = co_await blobpipe::sender::start(std::move(t), opt);
      if (sec == errc::peer_failed || sec == errc::peer_closed) {
        // Accepted (by the kernel), then dropped before the trainer's hello:
        // say, a trainer of another process that takes fewer connections
        // than this --workers (in this process, one that gave up).
        std::string why = "the trainer dropped the connection before its hello";
        if (cfg.remote_trainer) why += " (does it expect fewer --workers?)";
        co_return connected{sec, {}, "handshake with " + where, error_text(sec, why)};
      }
      if (sec) co_return connected{sec, {}, "handshake with " + where, error_text(sec)};
      co_return connected{{}, std::move(s), {}, {}};
    }
    if (ec != errc::peer_failed) co_return connected{ec, {}, "connect to " + where, error_text(ec)};
    // peer_failed: nothing accepted there (the library says no more; the
    // host resolved when the program started); a trainer still starting
    // gets time.
    if (std::chrono::steady_clock::now() >= give_up) {
      const auto secs = std::chrono::duration<double>(cfg.connect_patience).count();
      std::ostringstream why;
      why << "could not connect, retried for " << secs << " s";
      // In this process the trainer listens already, or has given up.
      if (cfg.remote_trainer) why << " (is a trainer listening there?)";
      co_return connected{ec, {}, "connect to " + where, error_text(ec, why.str())};
    }
    asio::steady_timer wait(ex, retry_interval);
    co_await wait.async_wait(as_tuple(asio::use_awaitable));
  }
}

std::string describe(const worker_config& cfg, const std::string& step, const std::string& why) {
  return "worker " + std::to_string(cfg.id) + ": " + step + ": " + why;
}

std::string describe(const worker_config& cfg, const std::string& step, std::error_code ec,
                     std::string_view reason = {}) {
  return describe(cfg, step, error_text(ec, reason));
}

// Streams samples id, id + count, ... < batch. Each sample's vectors live
// in this frame until its last emit has completed (emit borrows them).
asio::awaitable<worker_report> stream_samples(blobpipe::sender& s, const worker_config& cfg,
                                              const sample_builder& builder) {
  worker_report r;
  for (std::size_t n = cfg.id; n < cfg.batch; n += cfg.count) {
    sample smp;
    {
      cpu_scope building(app_cpu().build_s);
      smp = builder.make(static_cast<std::int64_t>(n));
      if (cfg.corrupt_sample == n) corrupt(smp);
    }
    auto blob = s.open_blob();
    for (const field& f : fields_to_send(smp, cfg.drop_entry)) {
      if (auto ec = co_await blob.emit(f.key, f.value)) {
        r.ec = ec;
        r.what = describe(cfg, "emit " + f.key, ec, blob.last_error());
        co_return r;
      }
    }
    if (auto ec = co_await blob.finish()) {
      r.ec = ec;
      r.what = describe(cfg, "finish sample " + std::to_string(n), ec, s.failure_reason());
      co_return r;
    }
    ++r.blobs;
  }
  co_return r;
}

// Streams the replay set's blobs id, id + count, ... under their own tags.
asio::awaitable<worker_report> stream_replay(blobpipe::sender& s, const worker_config& cfg) {
  worker_report r;
  const auto& blobs = cfg.replay->blobs;
  for (std::size_t b = cfg.id; b < blobs.size(); b += cfg.count) {
    const replay_blob& src = blobs[b];
    auto blob = s.open_blob(src.index.foot.tag);
    for (std::size_t i = 0; i < src.index.entries.size(); ++i) {
      if (auto ec = co_await blob.emit(src.index.entries[i].key, entry_value(src, i))) {
        r.ec = ec;
        r.what = describe(cfg, src.name + ": emit entry " + std::to_string(i), ec,
                          blob.last_error());
        co_return r;
      }
    }
    if (auto ec = co_await blob.finish()) {
      r.ec = ec;
      r.what = describe(cfg, src.name + ": finish", ec, s.failure_reason());
      co_return r;
    }
    ++r.blobs;
  }
  co_return r;
}

}  // namespace

std::vector<field> fields_to_send(const sample& s, std::optional<std::size_t> drop) {
  auto out = fields(s);
  if (drop && static_cast<std::int64_t>(*drop) == s.idx) out.erase(out.begin() + 2);
  return out;
}

// -Wmismatched-new-delete (GCC 11 and later; seen with 12) is a false
// positive on this coroutine: asio's frame allocator, awaitable_frame_base::
// operator new, is inlined here down to std::aligned_alloc, but its matching
// operator delete (which frees with std::free) is not, so GCC pairs
// aligned_alloc with a class operator delete it cannot see into. The pair
// is asio's own new/delete, and it matches.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
asio::awaitable<worker_report> run_worker(asio::any_io_executor ex, worker_config cfg,
                                          std::shared_ptr<const sample_builder> builder) {
  auto c = co_await connect_sender(ex, cfg);
  if (c.ec) {
    worker_report r;
    r.ec = c.ec;
    r.what = describe(cfg, c.step, c.why);
    co_return r;
  }
  blobpipe::sender& s = c.sender;

  worker_report r;
  if (cfg.replay) {
    r = co_await stream_replay(s, cfg);
  } else {
    r = co_await stream_samples(s, cfg, *builder);
  }
  if (!r.ec) {
    if (auto e = co_await s.shutdown()) {
      r.ec = e;
      r.what = describe(cfg, "shutdown", e, s.failure_reason());
    }
  }
  r.stats = s.stats();
  co_return r;
}
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#pragma GCC diagnostic pop
#endif

}  // namespace rollout
