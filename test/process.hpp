// test/process.hpp — runs a program as a child process and captures its
// exit status, stdout and stderr (cli_test, examples_test).
//
// Output goes to temporary files in the test's scratch directory, not to
// pipes: a program may print megabytes (inspect of many_entries), and files
// need no concurrent draining while it runs, even with two programs started
// side by side. Failures to start are BOOST_TEST_REQUIRE failures.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace blobpipe::testing {

struct run_result {
  int exit_code = -1;  ///< the exit status, or 128 + the signal that ended it
  std::string out;
  std::string err;
};

/// Bazel's per-test TEST_TMPDIR, else the system's temporary directory.
inline std::filesystem::path scratch_dir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t && *t ? std::filesystem::path(t) : std::filesystem::temp_directory_path();
}

/// Everything written to `fd`, from its start.
inline std::string slurp_fd(int fd) {
  std::string s;
  ::lseek(fd, 0, SEEK_SET);
  char buf[1 << 16];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
  return s;
}

/// This process's environment with `extra` ("NAME=value" each) added,
/// replacing a variable of the same name.
inline std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> env(extra);
  for (char** e = environ; *e; ++e) {
    const std::string var = *e;
    const std::string name = var.substr(0, var.find('=') + 1);
    bool replaced = false;
    for (const auto& x : extra) replaced = replaced || x.starts_with(name);
    if (!replaced) env.push_back(var);
  }
  return env;
}

/// A started program whose stdout and stderr go to temporary files (or
/// its stdout to `stdout_to`, say /dev/full; then `out` stays empty). It
/// gets this process's environment plus `extra_env` ("NAME=value" each).
class process {
 public:
  process(const std::filesystem::path& exe, const std::vector<std::string>& args,
          const std::optional<std::filesystem::path>& stdout_to = std::nullopt,
          const std::vector<std::string>& extra_env = {}) {
    std::vector<std::string> env = environment_with(extra_env);
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    out_ = temp_file("out");
    err_ = temp_file("err");
    std::vector<std::string> all{exe.string()};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if (stdout_to) {
      posix_spawn_file_actions_addopen(&fa, 1, stdout_to->c_str(), O_WRONLY, 0);
    } else {
      posix_spawn_file_actions_adddup2(&fa, out_.fd, 1);
    }
    posix_spawn_file_actions_adddup2(&fa, err_.fd, 2);
    int rc = ::posix_spawn(&pid_, all[0].c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    BOOST_TEST_REQUIRE(rc == 0, "cannot start " << exe << ": " << std::strerror(rc));
  }

  /// What the program has written to stdout so far (pread: the file
  /// offset it shares with the program's stdout stays where it is).
  std::string stdout_so_far() const {
    std::string s;
    char buf[1 << 16];
    for (ssize_t n; (n = ::pread(out_.fd, buf, sizeof buf, static_cast<off_t>(s.size()))) > 0;)
      s.append(buf, static_cast<size_t>(n));
    return s;
  }

  /// Waits until `done(stdout so far)` is true, the program has ended, or
  /// `guard` has passed (a hang bound, not a timing assertion); woken by
  /// the program's writes (inotify on its stdout file) and its exit (a
  /// pidfd), never by a timer. Returns whether `done` held.
  template <class Done>
  bool wait_for_stdout(Done done, std::chrono::milliseconds guard = std::chrono::seconds(30)) const {
    const auto until = std::chrono::steady_clock::now() + guard;
    const int writes = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    BOOST_TEST_REQUIRE(writes >= 0, "inotify_init1: " << std::strerror(errno));
    BOOST_TEST_REQUIRE(::inotify_add_watch(writes, out_.path.c_str(), IN_MODIFY) >= 0);
    const int exited = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
    bool held = false;
    for (;;) {
      // Checked after the watch is set: a write in between is not missed.
      if ((held = done(stdout_so_far()))) break;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd fds[2] = {{writes, POLLIN, 0}, {exited, POLLIN, 0}};
      const int n = ::poll(fds, exited >= 0 ? 2 : 1, static_cast<int>(left.count()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (exited >= 0 && (fds[1].revents & POLLIN)) {  // ended: its output is all there is
        held = done(stdout_so_far());
        break;
      }
      char events[4096];
      while (::read(writes, events, sizeof events) > 0) {
      }
    }
    if (exited >= 0) ::close(exited);
    ::close(writes);
    return held;
  }

  /// Sends `sig` to the program.
  void signal(int sig) const { BOOST_TEST_REQUIRE(::kill(pid_, sig) == 0); }

  /// Waits for the program to end; returns its status and output (and
  /// removes the temporary files).
  run_result wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    run_result r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = finish(out_);
    r.err = finish(err_);
    return r;
  }

 private:
  struct temp {
    std::string path;
    int fd = -1;
  };
  static temp temp_file(const char* what) {
    temp t{(scratch_dir() / (std::string("process_") + what + "_XXXXXX")).string()};
    t.fd = ::mkstemp(t.path.data());
    BOOST_TEST_REQUIRE(t.fd >= 0);
    return t;
  }
  static std::string finish(temp& t) {
    std::string s = slurp_fd(t.fd);
    ::close(t.fd);
    ::unlink(t.path.c_str());
    return s;
  }
  pid_t pid_ = -1;
  temp out_, err_;
};

/// Runs `exe` with `args` to its end.
inline run_result run_process(const std::filesystem::path& exe,
                              const std::vector<std::string>& args,
                              const std::optional<std::filesystem::path>& stdout_to = std::nullopt,
                              const std::vector<std::string>& extra_env = {}) {
  return process(exe, args, stdout_to, extra_env).wait();
}

}  // namespace blobpipe::testing
