// examples/rollout/progress.hpp — the trainer's (or the ranks') progress line.
//
// On a terminal one line is redrawn in place ("\r", at most every
// 100 ms and once at the end); into a pipe or file, where "\r" would
// leave a mess, a plain line is printed at each quarter of the work.
//
//   rollout::progress p(std::cout, rollout::stdout_is_tty());
//   p.update(done, total, "samples", entries, bytes);  // after each event
//   p.finish();
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include <asio/signal_set.hpp>

namespace rollout {

bool stdout_is_tty() noexcept;

/// Adds SIGTERM and SIGINT to `signals`, the signals that end a run early
/// with a summary; a SIGINT the shell had ignored (a background job) stays
/// ignored.
void add_stop_signals(asio::signal_set& signals);

/// "SIGINT", "SIGTERM", else "signal N".
std::string signal_name(int signo);

class progress {
 public:
  /// `who` labels the line ("[trainer] 12/256 samples ..."); it must
  /// outlive the progress (a string literal).
  progress(std::ostream& out, bool tty, const char* who = "trainer");

  /// Restarts the clock the line shows (say, when the first worker connects).
  void restart() noexcept;

  void update(std::uint64_t done, std::uint64_t total, const char* unit,
              std::uint64_t entries, std::uint64_t bytes);
  /// Ends the in-place line (terminal only). Idempotent.
  void finish();

 private:
  void print(std::uint64_t done, std::uint64_t total, const char* unit,
             std::uint64_t entries, std::uint64_t bytes);

  std::ostream& out_;
  bool tty_;
  const char* who_;
  bool open_line_ = false;
  bool drew_total_ = false;  // the final state is drawn once
  int quarters_printed_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

/// The steady-state rate, apart from start-up: bytes and samples between
/// the moments 10 % and 90 % of the samples were complete (the time to
/// the first entry is reported on its own).
///
///   rollout::steady_rate r;
///   r.update(done, total, bytes);  // after each event
///   out << r.text() << "\n";
class steady_rate {
 public:
  void update(std::uint64_t done, std::uint64_t total, std::uint64_t bytes);
  /// "steady state (samples 10-90 %): 812.3 MB/s, 15321 samples/s (X MB
  /// in Y s)", or why there is no such figure (too few samples).
  std::string text() const;

 private:
  struct mark {
    std::chrono::steady_clock::time_point at;
    std::uint64_t done = 0, bytes = 0;
  };
  std::optional<mark> from_, to_;
};

}  // namespace rollout
