// examples/rollout/cpu.cpp — see cpu.hpp.
#include "examples/rollout/cpu.hpp"

#include <sys/resource.h>

#include <cstdio>

namespace rollout {

double monotonic_s() noexcept {
  timespec ts{};
  if (::clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

app_cpu_account& app_cpu() noexcept {
  static app_cpu_account account;
  return account;
}

void print_cpu(std::ostream& out, const std::string& who, double wall_s) {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto secs = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  const double user = secs(ru.ru_utime), sys = secs(ru.ru_stime);
  const app_cpu_account& a = app_cpu();
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "cpu (%s): %.2f s user + %.2f s system in %.2f s wall; the trainer's checks "
                "%.2f s, sample building %.2f s, the rest (blobpipe and the event loop) %.2f s\n",
                who.c_str(), user, sys, wall_s, a.check_s, a.build_s,
                user + sys - a.check_s - a.build_s);
  out << buf;
}

}  // namespace rollout
