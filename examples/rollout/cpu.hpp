// examples/rollout/cpu.hpp — where a run's CPU time goes, for the summary
// line that sits next to the wall time.
//
// The process's user and system seconds (getrusage) cover everything; the
// example's own work is timed around it with the monotonic clock: the
// trainer's check of each entry and the workers' building of each sample.
// These calls never wait, and the example runs one io_context on one
// thread, so the time inside them is that thread's CPU time unless the
// kernel preempts it there (a loaded machine inflates them a little). The
// thread's CPU clock would be exact, but it is a system call per reading
// (12 % of a rank's CPU in a profile; the monotonic clock is read in user
// space). What is left is the library (transport, framing, events) and the
// event loop. The accounts are plain counters (one thread).
//
//   { rollout::cpu_scope s(rollout::app_cpu().check_s); check->on_entry(...); }
//   rollout::print_cpu(std::cout, "trainer and workers", wall_seconds, true, true);
#pragma once

#include <ctime>
#include <ostream>
#include <string>

namespace rollout {

/// Seconds on the monotonic clock (CLOCK_MONOTONIC, read without a system
/// call), for cpu_scope.
double monotonic_s() noexcept;

/// This process's CPU seconds spent in the example's own work.
struct app_cpu_account {
  double check_s = 0;  ///< the trainer's checks (checker::on_entry)
  double build_s = 0;  ///< the workers' sample building (sample_builder::make)
};
app_cpu_account& app_cpu() noexcept;

/// Adds the seconds between construction and destruction to `into`: the
/// thread's CPU time in a call that does not wait (see above).
class cpu_scope {
 public:
  explicit cpu_scope(double& into) noexcept : into_(into), start_(monotonic_s()) {}
  ~cpu_scope() { into_ += monotonic_s() - start_; }
  cpu_scope(const cpu_scope&) = delete;
  cpu_scope& operator=(const cpu_scope&) = delete;

 private:
  double& into_;
  double start_;
};

/// One line: "cpu (WHO): U s user + S s system in W s wall; in the
/// example's own work: the trainer's checks C s, sample building B s"
/// (the checks when `checks`, the building when `building`). `wall_s`:
/// seconds since the run started. U + S is everything the process did;
/// C and B are timed as above, so on a loaded machine they can exceed
/// their CPU time (even U + S).
void print_cpu(std::ostream& out, const std::string& who, double wall_s, bool checks,
               bool building);

}  // namespace rollout
