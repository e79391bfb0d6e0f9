// examples/rollout/progress.cpp — see progress.hpp.
#include "examples/rollout/progress.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iomanip>

namespace rollout {
namespace {
constexpr auto redraw_interval = std::chrono::milliseconds(100);
}

bool stdout_is_tty() noexcept { return ::isatty(STDOUT_FILENO) == 1; }

void add_stop_signals(asio::signal_set& signals) {
  struct sigaction old {};
  if (::sigaction(SIGINT, nullptr, &old) != 0 || old.sa_handler != SIG_IGN) signals.add(SIGINT);
  signals.add(SIGTERM);
}

std::string signal_name(int signo) {
  if (signo == SIGINT) return "SIGINT";
  if (signo == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(signo);
}

progress::progress(std::ostream& out, bool tty, const char* who)
    : out_(out), tty_(tty), who_(who), start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

void progress::restart() noexcept { start_ = last_draw_ = std::chrono::steady_clock::now(); }

void progress::update(std::uint64_t done, std::uint64_t total, const char* unit,
                      std::uint64_t entries, std::uint64_t bytes) {
  const auto now = std::chrono::steady_clock::now();
  if (tty_) {
    const bool final_state = done == total && !drew_total_;
    if (final_state || (done != total && now - last_draw_ >= redraw_interval)) {
      drew_total_ = done == total;
      last_draw_ = now;
      out_ << "\r\033[K";  // back to column 0, clear the old line
      print(done, total, unit, entries, bytes);
      out_ << std::flush;
      open_line_ = true;
    }
    return;
  }
  // Plain lines at 25, 50, 75 and 100 %.
  const int quarter = total ? static_cast<int>(done * 4 / total) : 4;
  if (quarter > quarters_printed_) {
    quarters_printed_ = quarter;
    print(done, total, unit, entries, bytes);
    out_ << '\n';
  }
}

void progress::print(std::uint64_t done, std::uint64_t total, const char* unit,
                     std::uint64_t entries, std::uint64_t bytes) {
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const auto flags = out_.flags();
  out_ << "[" << who_ << "] " << done << "/" << total << " " << unit << "  " << entries
       << " entries  " << std::fixed << std::setprecision(2) << static_cast<double>(bytes) / 1e6
       << " MB  " << std::setprecision(1) << secs * 1e3 << " ms";
  out_.flags(flags);
}

void progress::finish() {
  if (open_line_) out_ << '\n' << std::flush;
  open_line_ = false;
}

void steady_rate::update(std::uint64_t done, std::uint64_t total, std::uint64_t bytes) {
  if (to_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!from_ && done * 10 >= total) from_ = mark{now, done, bytes};
  if (from_ && done * 10 >= total * 9) to_ = mark{now, done, bytes};
}

std::string steady_rate::text() const {
  if (!from_ || !to_ || to_->done <= from_->done || to_->at <= from_->at)
    return "steady state: too few samples to tell apart from start-up";
  const double secs = std::chrono::duration<double>(to_->at - from_->at).count();
  const double mb = static_cast<double>(to_->bytes - from_->bytes) / 1e6;
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "steady state (samples 10-90 %%): %.1f MB/s, %.0f samples/s (%.2f MB in %.3f s)",
                mb / secs, static_cast<double>(to_->done - from_->done) / secs, mb, secs);
  return buf;
}

}  // namespace rollout
