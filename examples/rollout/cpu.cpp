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

void print_cpu(std::ostream& out, const std::string& who, double wall_s, bool checks,
               bool building) {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  auto secs = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  const app_cpu_account& a = app_cpu();
  char buf[320];
  int n = std::snprintf(buf, sizeof buf, "cpu (%s): %.2f s user + %.2f s system in %.2f s wall",
                        who.c_str(), secs(ru.ru_utime), secs(ru.ru_stime), wall_s);
  if (checks || building) {
    n += std::snprintf(buf + n, sizeof buf - n, "; in the example's own work");
    if (checks) n += std::snprintf(buf + n, sizeof buf - n, ": the trainer's checks %.2f s", a.check_s);
    if (building)
      n += std::snprintf(buf + n, sizeof buf - n, "%s sample building %.2f s", checks ? "," : ":",
                         a.build_s);
  }
  out << buf << "\n";
}

}  // namespace rollout
