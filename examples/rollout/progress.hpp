// examples/rollout/progress.hpp — the trainer's progress line.
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
#include <ostream>

namespace rollout {

bool stdout_is_tty() noexcept;

class progress {
 public:
  progress(std::ostream& out, bool tty);

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
  bool open_line_ = false;
  bool drew_total_ = false;  // the final state is drawn once
  int quarters_printed_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace rollout
