// test/examples_test.cpp — runs the example programs as a user would and
// checks their exit status and summary lines.
//
// rollout_to_trainer: a small batch in one process, the same as two
// processes (--listen / --connect), a replay of every valid golden blob,
// and the failures it must report (missing samples, bad flags).
// custom_pipeline: the filter and cast stages run and the trainer gets
// exactly the samples that pass the filter.
#define BOOST_TEST_MODULE examples_test
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "test/golden_dir.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;

struct run_result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

fs::path example(const char* name) { return blobpipe::testing::runfiles_root() / "examples" / name; }

fs::path scratch_dir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t && *t ? fs::path(t) : fs::temp_directory_path();
}

std::string slurp_fd(int fd) {
  std::string s;
  ::lseek(fd, 0, SEEK_SET);
  char buf[1 << 16];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) s.append(buf, static_cast<size_t>(n));
  return s;
}

// A started program whose stdout and stderr go to temporary files (no
// pipes to drain while it runs).
class process {
 public:
  process(const fs::path& exe, const std::vector<std::string>& args) {
    out_ = temp_file("out");
    err_ = temp_file("err");
    std::vector<std::string> all{exe.string()};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out_.fd, 1);
    posix_spawn_file_actions_adddup2(&fa, err_.fd, 2);
    int rc = ::posix_spawn(&pid_, all[0].c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    BOOST_TEST_REQUIRE(rc == 0, "cannot start " << exe << ": " << std::strerror(rc));
  }

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
    temp t{(scratch_dir() / (std::string("example_") + what + "_XXXXXX")).string()};
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

run_result run(const char* name, const std::vector<std::string>& args) {
  return process(example(name), args).wait();
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// A port nothing listens on right now (the kernel's next ephemeral port).
// Another process could take it before the trainer binds; unlikely enough
// on a test machine, and the failure would be loud (listen fails).
std::uint16_t free_port() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  BOOST_TEST_REQUIRE(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  BOOST_TEST_REQUIRE(::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(s);
  return ntohs(a.sin_port);
}

#define REPORT(r) "exit " << (r).exit_code << "\nstdout:\n" << (r).out << "\nstderr:\n" << (r).err

}  // namespace

BOOST_AUTO_TEST_CASE(rollout_to_trainer_delivers_a_complete_batch) {
  auto r = run("rollout_to_trainer", {"--batch", "32", "--workers", "3"});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "trainer: 32/32 samples complete, 160 entries in 32 blobs"), REPORT(r));
  BOOST_TEST(contains(r.out, "OK: every sample arrived complete"), REPORT(r));
  BOOST_TEST(contains(r.out, "time to first entry: "), REPORT(r));
  BOOST_TEST(contains(r.out, "throughput: "), REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_runs_over_ucx) {
  // The same workers and trainer with UCX as the transport (UCX_TLS as the
  // environment sets it; UCX picks tcp or shared memory on loopback).
  auto r = run("rollout_to_trainer", {"--transport", "ucx", "--batch", "32", "--workers", "2"});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "trainer: 32/32 samples complete, 160 entries in 32 blobs"), REPORT(r));
  BOOST_TEST(contains(r.out, "OK: every sample arrived complete"), REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_replays_every_valid_golden_blob) {
  auto g = blobpipe::testing::find_golden_dir();
  BOOST_TEST_REQUIRE(g.dir.has_value(), "golden dir not found; tried " << g.tried);
  std::ifstream in(*g.dir / "manifest.json");
  auto manifest = nlohmann::json::parse(in);
  std::size_t valid = 0, invalid = 0;
  for (const auto& c : manifest.at("cases")) {
    if (!c.at("file").get<std::string>().ends_with(".blob")) continue;
    (c.at("valid").get<bool>() ? valid : invalid)++;
  }
  BOOST_TEST_REQUIRE(valid > 0u);

  auto r = run("rollout_to_trainer", {"--replay", g.dir->string()});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "skipping " + std::to_string(invalid) + " invalid"), REPORT(r));
  BOOST_TEST(contains(r.out, "OK: replayed " + std::to_string(valid) +
                                 " blobs; every entry is byte-identical to its file"),
             REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_runs_as_two_processes) {
  const std::string port = std::to_string(free_port());
  process trainer(example("rollout_to_trainer"),
                  {"--listen", port, "--workers", "2", "--batch", "16", "--timeout", "15"});
  process workers(example("rollout_to_trainer"),
                  {"--connect", "127.0.0.1:" + port, "--workers", "2", "--batch", "16"});
  auto w = workers.wait();
  auto t = trainer.wait();
  BOOST_TEST(w.exit_code == 0, REPORT(w));
  BOOST_TEST(contains(w.out, "sent 16 blobs"), REPORT(w));
  BOOST_TEST(t.exit_code == 0, REPORT(t));
  BOOST_TEST(contains(t.out, "OK: every sample arrived complete"), REPORT(t));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_fails_when_samples_are_missing) {
  // The workers make a smaller batch than the trainer waits for.
  const std::string port = std::to_string(free_port());
  process trainer(example("rollout_to_trainer"),
                  {"--listen", port, "--workers", "1", "--batch", "8", "--timeout", "15"});
  process workers(example("rollout_to_trainer"),
                  {"--connect", "127.0.0.1:" + port, "--workers", "1", "--batch", "5"});
  auto w = workers.wait();
  auto t = trainer.wait();
  BOOST_TEST(w.exit_code == 0, REPORT(w));
  BOOST_TEST(t.exit_code == 1, REPORT(t));
  BOOST_TEST(contains(t.out, "FAIL: the batch is incomplete"), REPORT(t));
  BOOST_TEST(contains(t.out, "sample 5 incomplete"), REPORT(t));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_rejects_bad_flags) {
  auto rdma = run("rollout_to_trainer", {"--transport", "rdma"});
  BOOST_TEST(rdma.exit_code == 2, REPORT(rdma));
  BOOST_TEST(contains(rdma.err, "unknown transport 'rdma'"), REPORT(rdma));
  auto dir = run("rollout_to_trainer", {"--replay", (scratch_dir() / "no_such_dir").string()});
  BOOST_TEST(dir.exit_code == 2, REPORT(dir));
  auto help = run("rollout_to_trainer", {"--help"});
  BOOST_TEST(help.exit_code == 0, REPORT(help));
  BOOST_TEST(contains(help.out, "--replay DIR"), REPORT(help));
}

BOOST_AUTO_TEST_CASE(custom_pipeline_filters_and_casts) {
  auto r = run("custom_pipeline", {});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "sample dropped"), REPORT(r));
  BOOST_TEST(contains(r.out, "float32 -> bfloat16"), REPORT(r));
  BOOST_TEST(contains(r.out, "bfloat16["), REPORT(r));
}
