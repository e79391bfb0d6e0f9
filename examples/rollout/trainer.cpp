// examples/rollout/trainer.cpp — see trainer.hpp.
#include "examples/rollout/trainer.hpp"

#include <iomanip>
#include <vector>

#include "examples/rollout/cpu.hpp"
#include "examples/rollout/error_text.hpp"
#include "examples/rollout/reporting.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>

namespace rollout {

using asio::experimental::as_tuple;
using blobpipe::event_kind;

trainer::trainer(asio::any_io_executor ex, std::unique_ptr<blobpipe::listener> l,
                 std::unique_ptr<checker> check, trainer_config cfg, std::ostream& out)
    : ex_(ex),
      listener_(std::move(l)),
      check_(std::move(check)),
      cfg_(cfg),
      out_(out),
      progress_(out, cfg.tty),
      idle_(ex, clock::time_point::max()),
      deadline_(ex, cfg.timeout) {}

asio::awaitable<bool> trainer::run() {
  auto self = shared_from_this();
  asio::co_spawn(ex_, reporting(watchdog(self), [self](std::string what) {
                   self->problems_.add("watchdog: " + what);
                 }), asio::detached);

  // Until cfg_.connections workers have done their handshake (consume()
  // stops accepting then): a connection that fails it is not one.
  for (std::size_t conn = 0; accepting_; ++conn) {
    auto [ec, t] = co_await listener_->accept();
    if (ec) {
      if (!stopping_ && accepting_) problems_.add("accept: " + error_text(ec));
      break;
    }
    if (!first_accept_) {
      first_accept_ = clock::now();
      progress_.restart();
    }
    ++active_;
    // An exception that ends consume() (say, std::bad_alloc in the checker)
    // is a connection problem like any other.
    asio::co_spawn(ex_, reporting(consume(self, conn, std::move(t)), [self, conn](std::string what) {
                     self->problems_.add("connection " + std::to_string(conn) + ": " + what);
                   }), asio::detached);
  }
  accepting_ = false;
  listener_->close();

  // Wait for every stream to end; each consume() wakes us as it leaves.
  while (active_ > 0) co_await idle_.async_wait(as_tuple(asio::use_awaitable));
  deadline_.cancel();
  progress_.finish();
  co_return print_summary();
}

void trainer::stop_accepting() noexcept {
  if (!accepting_) return;
  accepting_ = false;
  listener_->close();
}

asio::awaitable<void> trainer::consume(std::shared_ptr<trainer> self, std::size_t conn,
                                       std::unique_ptr<blobpipe::transport> t) {
  // However this coroutine ends, its stream's end or an exception, the
  // connection leaves the books: no closer is left pointing at a consumer
  // this frame destroyed, and run() stops waiting for it.
  struct leave {
    trainer& tr;
    std::size_t conn;
    bool worker = false;
    ~leave() {
      tr.closers_.erase(conn);
      if (worker) --tr.working_;
      if (--tr.active_ == 0) tr.idle_.cancel();
    }
  } on_exit{*self, conn};
  blobpipe::transport* raw = t.get();  // alive until start() returns
  self->closers_[conn] = [raw] { raw->close(); };
  self->handshaking_.insert(conn);
  blobpipe::consumer_options opt;
  opt.handshake_timeout = self->cfg_.handshake_timeout;
  opt.idle_timeout = self->cfg_.idle_timeout;
  auto [ec, c] = co_await blobpipe::consumer::start(std::move(t), opt);
  self->handshaking_.erase(conn);
  if (ec) {
    // Not a worker: the trainer goes on waiting for one (unless it has all
    // it wants, and closed this one itself).
    if (!self->stopping_ && self->accepting_)
      self->not_workers_.add("connection " + std::to_string(conn) + ": handshake: " +
                             error_text(ec));
    co_return;
  }
  if (self->accepted_ == self->cfg_.connections) co_return;  // one too many: closed
  ++self->accepted_;
  ++self->working_;
  on_exit.worker = true;
  if (self->accepted_ == self->cfg_.connections) self->take_no_more(conn);
  self->closers_[conn] = [&c] { c.close(); };
  co_await self->drain(conn, c);
}

// Every worker has come: no more connections, and those still in their
// handshake (strays, or workers beyond --workers) are closed.
void trainer::take_no_more(std::size_t last) noexcept {
  stop_accepting();
  for (std::size_t conn : std::set(handshaking_))
    if (conn != last) closers_[conn]();
}

// One connection's events, in order, until its end of stream: a read's
// events at once (next_batch), each event (and the entry it holds) dropped
// once checked, before the next is looked at.
asio::awaitable<void> trainer::drain(std::size_t conn, blobpipe::consumer& c) {
  std::vector<blobpipe::event> batch;
  for (;;) {
    batch.clear();
    co_await c.next_batch(batch);
    for (blobpipe::event& ev : batch) {
      switch (ev.kind) {
        case event_kind::entry_ready:
          if (!first_entry_) first_entry_ = clock::now();
          {
            cpu_scope checking(app_cpu().check_s);
            check_->on_entry(conn, *ev.entry);
          }
          break;
        case event_kind::blob_complete:
          check_->on_blob(conn, *ev.blob, ev.tag);
          break;
        case event_kind::blob_aborted:
          check_->on_aborted(conn, ev);
          break;
        case event_kind::end_of_stream:
          if (ev.error && !stopping_)
            problems_.add("connection " + std::to_string(conn) + " ended: " +
                          error_text(ev.error, ev.reason));
          co_return;
      }
      ev = blobpipe::event{};
    }
    last_data_ = clock::now();
    progress_.update(check_->done(), check_->total(), check_->unit(), check_->entries(),
                     check_->bytes());
    steady_.update(check_->done(), check_->total(), check_->bytes());
  }
}

asio::awaitable<void> trainer::watchdog(std::shared_ptr<trainer> self) {
  auto [ec] = co_await self->deadline_.async_wait(as_tuple(asio::use_awaitable));
  if (ec) co_return;  // cancelled: run() finished in time
  self->timed_out_ = true;
  self->working_at_timeout_ = self->working_;
  self->stop();
}

void trainer::interrupt(std::string why) {
  interrupted_ = std::move(why);
  stop();
}

void trainer::stop() noexcept {
  stopping_ = true;
  stop_accepting();
  // Each consume() erases its closer when it resumes; take a copy so that
  // can never disturb this loop.
  auto closers = closers_;
  for (auto& [conn, close] : closers) close();
}

bool trainer::print_summary() {
  using ms = std::chrono::duration<double, std::milli>;
  const auto flags = out_.flags();
  if (first_accept_ && first_entry_ && last_data_) {
    const double secs = std::chrono::duration<double>(*last_data_ - *first_accept_).count();
    const double bytes = static_cast<double>(check_->bytes());
    const double entries = static_cast<double>(check_->entries());
    out_ << "throughput: " << std::fixed << std::setprecision(3) << bytes / secs / 1e9
         << " GB/s, " << std::setprecision(0) << entries / secs << " entries/s ("
         << check_->entries() << " entries, " << std::setprecision(2) << bytes / 1e6
         << " MB in " << std::setprecision(1) << secs * 1e3 << " ms)\n"
         << "time to first entry: " << std::setprecision(2)
         << ms(*first_entry_ - *first_accept_).count() << " ms\n"
         << steady_.text() << "\n";
  }
  out_.flags(flags);
  bool ok = check_->report(out_);
  if (!interrupted_.empty()) {
    out_ << "FAIL: interrupted by " << interrupted_ << "\n";
    ok = false;
  }
  if (timed_out_) {
    print_timeout();
    ok = false;
  } else if (interrupted_.empty() && problems_.empty()) {
    print_short_of_data();
  }
  if (!problems_.empty()) {
    out_ << "FAIL: connection problems\n";
    problems_.print(out_);
    ok = false;
  }
  if (!not_workers_.empty()) {
    // Not a failure: such connections were not workers (a stray client, a
    // port scanner); the workers were counted without them.
    out_ << "note: connections that failed their handshake (not counted as workers):\n";
    not_workers_.print(out_);
  }
  // The one verdict: OK only when nothing above failed.
  if (ok) out_ << "OK: " << check_->ok_text() << "\n";
  return ok;
}

// What the trainer was still waiting for when the watchdog fired: more
// connections, or the end of streams it had accepted.
void trainer::print_timeout() {
  const auto secs = std::chrono::duration<double>(cfg_.timeout).count();
  const std::size_t expected = cfg_.connections;
  const bool short_of_connections = accepted_ < expected;
  out_ << "FAIL: timed out after " << secs << " s waiting for ";
  if (accepted_ == 0) {
    out_ << "worker connections: none of the " << expected << " expected (--workers " << expected
         << ") arrived";
  } else if (short_of_connections) {
    out_ << "worker connections: accepted " << accepted_ << " of the " << expected
         << " expected (--workers " << expected << "), " << accepted_ - working_at_timeout_
         << " of them ended";
  } else {
    out_ << working_at_timeout_ << " of " << accepted_ << " connection(s) to end";
  }
  out_ << "; " << check_->done() << "/" << check_->total() << " " << check_->unit()
       << " complete\n";
  if (cfg_.remote_workers && short_of_connections && accepted_ > 0 && working_at_timeout_ == 0)
    out_ << "  every accepted connection ended and no more came: the workers (--connect) may "
            "have been\n  started with a smaller --workers than this trainer's "
         << expected << "; give both sides the same --workers\n";
}

// Every connection this trainer expected came and ended in order, and data
// is still missing: the opposite case of print_timeout's hint. The workers
// may run more connections than this trainer takes (the extra ones find it
// no longer listening), or build another batch.
void trainer::print_short_of_data() {
  // Data that arrived different (another --seq-len, say) is not a matter of
  // connection counts: the checker's report named what differs.
  if (!cfg_.remote_workers || accepted_ < cfg_.connections || check_->done() >= check_->total() ||
      check_->differs())
    return;
  const std::size_t n = cfg_.connections;
  out_ << "  all " << n << " connection(s) this trainer expected (--workers " << n
       << ") ended in order, " << check_->total() - check_->done() << " " << check_->unit()
       << " short:\n  the workers (--connect) may have been started with a larger --workers "
          "than this\n  trainer's "
       << n << " (or another --batch or --replay); give both sides the same --workers,\n"
       << "  --batch and --replay\n";
}

}  // namespace rollout
