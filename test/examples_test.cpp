// test/examples_test.cpp — runs the example programs as a user would and
// checks their exit status and summary lines.
//
// rollout_to_trainer: a small batch in one process, the same as two
// processes (--listen / --connect), a replay of every valid golden blob,
// and the failures it must report (missing samples, bad flags).
// custom_pipeline: the filter and cast stages run and the trainer gets
// exactly the samples that pass the filter; it refuses arguments but --help.
#define BOOST_TEST_MODULE examples_test
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "test/golden_dir.hpp"
#include "test/process.hpp"
#include "test/skip.hpp"

namespace {

namespace fs = std::filesystem;
using blobpipe::testing::print_skip;
using blobpipe::testing::process;
using blobpipe::testing::run_process;
using blobpipe::testing::run_result;
using blobpipe::testing::scratch_dir;

fs::path example(const char* name) { return blobpipe::testing::runfiles_root() / "examples" / name; }

// Runs example `name` with `args` to its end (test/process.hpp).
run_result run(const char* name, const std::vector<std::string>& args) {
  return run_process(example(name), args);
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// A loopback port bound and never listened on, for as long as this lives:
// connecting to it is refused, and no other test can take it meanwhile (a
// port found free and let go may be bound again by a test running in
// parallel).
class refusing_port {
 public:
  refusing_port() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    BOOST_TEST_REQUIRE(fd_ >= 0);
    BOOST_TEST_REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    BOOST_TEST_REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
  }
  ~refusing_port() { ::close(fd_); }
  refusing_port(const refusing_port&) = delete;
  refusing_port& operator=(const refusing_port&) = delete;
  std::uint16_t port() const { return port_; }

 private:
  int fd_;
  std::uint16_t port_ = 0;
};

// Waits for a --listen trainer's first line (woken by its writes; at most
// 30 s, a hang bound) and returns the port it names ("... -> trainer, tcp
// HOST:PORT, ..."), or "" if none came.
std::string listening_port(const process& trainer) {
  std::string port;
  trainer.wait_for_stdout([&](const std::string& out) {
    const auto line_end = out.find('\n');
    const auto at = out.find(" -> trainer, ");
    if (at == std::string::npos || line_end == std::string::npos) return false;
    const auto end = out.find(", ", at + 13);
    const auto colon = out.rfind(':', end);
    if (end == std::string::npos || colon == std::string::npos || colon <= at) return false;
    port = out.substr(colon + 1, end - colon - 1);
    return true;
  });
  return port;
}

// A --listen trainer on a free port (PORT 0, read back from its first
// line, so no other test can take the port in between) and a --connect
// worker process, each with its own further arguments, both run to their
// ends.
struct two_processes {
  run_result trainer, workers;
};
// With `listen_host` and `connect_host` the trainer gets
// --listen LISTEN_HOST:0 (else --listen 0) and the workers
// --connect CONNECT_HOST:PORT.
two_processes run_two_processes(const std::vector<std::string>& trainer_args,
                                const std::vector<std::string>& worker_args,
                                const std::string& listen_host = "",
                                const std::string& connect_host = "127.0.0.1") {
  std::vector<std::string> t_args{"--listen", listen_host.empty() ? "0" : listen_host + ":0"};
  t_args.insert(t_args.end(), trainer_args.begin(), trainer_args.end());
  process trainer(example("rollout_to_trainer"), t_args);
  const std::string port = listening_port(trainer);
  BOOST_TEST_REQUIRE(!port.empty(), "the trainer named no port: " << trainer.stdout_so_far());
  std::vector<std::string> w_args{"--connect", connect_host + ":" + port};
  w_args.insert(w_args.end(), worker_args.begin(), worker_args.end());
  process workers(example("rollout_to_trainer"), w_args);
  auto w = workers.wait();
  return {trainer.wait(), std::move(w)};
}

// Waits for a --listen URL rank's first line ("... trainer rank K of N at
// URL, ..."; woken by its writes, at most 30 s) and returns the URL it
// names, or "".
std::string rank_url(const process& rank) {
  std::string url;
  rank.wait_for_stdout([&](const std::string& out) {
    const auto line_end = out.find('\n');
    const auto at = out.find(" at ");
    if (line_end == std::string::npos || at == std::string::npos || at >= line_end) return false;
    const auto end = out.find(", ", at);
    if (end == std::string::npos) return false;
    url = out.substr(at + 4, end - at - 4);
    return true;
  });
  return url;
}

// Trainer ranks 0 .. K-1 as K processes (--listen tcp://127.0.0.1:0 --rank
// k --trainers K, each with `rank_args`), then one worker process with
// --connect and the ranks' URLs in `order` (default 0 .. K-1) and
// `worker_args`; every process run to its end.
struct cluster_processes {
  std::vector<run_result> ranks;
  run_result workers;
};
cluster_processes run_cluster_processes(std::size_t k, const std::vector<std::string>& rank_args,
                                        const std::vector<std::string>& worker_args,
                                        std::vector<std::size_t> order = {}) {
  std::vector<std::unique_ptr<process>> ranks;
  std::vector<std::string> urls;
  for (std::size_t r = 0; r < k; ++r) {
    std::vector<std::string> args{"--listen", "tcp://127.0.0.1:0", "--rank", std::to_string(r),
                                  "--trainers", std::to_string(k)};
    args.insert(args.end(), rank_args.begin(), rank_args.end());
    ranks.push_back(std::make_unique<process>(example("rollout_to_trainer"), args));
    urls.push_back(rank_url(*ranks.back()));
    BOOST_TEST_REQUIRE(!urls.back().empty(),
                       "rank " << r << " named no URL: " << ranks.back()->stdout_so_far());
  }
  if (order.empty())
    for (std::size_t r = 0; r < k; ++r) order.push_back(r);
  std::string list;
  for (std::size_t r : order) list += (list.empty() ? "" : ",") + urls[r];
  std::vector<std::string> w_args{"--connect", list};
  w_args.insert(w_args.end(), worker_args.begin(), worker_args.end());
  cluster_processes out;
  out.workers = run_process(example("rollout_to_trainer"), w_args);
  for (auto& r : ranks) out.ranks.push_back(r->wait());
  return out;
}

#define REPORT(r) "exit " << (r).exit_code << "\nstdout:\n" << (r).out << "\nstderr:\n" << (r).err

}  // namespace

BOOST_AUTO_TEST_CASE(rollout_to_trainer_delivers_a_complete_batch) {
  auto r = run("rollout_to_trainer", {"--batch", "32", "--workers", "3", "--trainers", "1"});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "trainer: 32/32 samples complete, 160 entries in 32 blobs"), REPORT(r));
  BOOST_TEST(contains(r.out, "OK: every sample arrived complete"), REPORT(r));
  BOOST_TEST(contains(r.out, "time to first entry: "), REPORT(r));
  BOOST_TEST(contains(r.out, "throughput: "), REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_default_run_routes_groups_to_two_ranks) {
  // The default shape at a small batch (the default one is 8192 samples).
  auto r = run("rollout_to_trainer", {"--batch", "256"});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "4 rollout worker(s) -> 2 trainer ranks"), REPORT(r));
  // Groups of 4 alternate between the ranks: 128 samples, 32 groups each.
  BOOST_TEST(contains(r.out, "rank 0 (tcp://127.0.0.1:"), REPORT(r));
  BOOST_TEST(contains(r.out, "rank 1 (tcp://127.0.0.1:"), REPORT(r));
  BOOST_TEST(contains(r.out, "trainer: 128/128 samples complete, 640 entries in 128 blobs"),
             REPORT(r));
  BOOST_TEST(contains(r.out, "4 connection(s), groups complete 32/32, entry latency p50 "),
             REPORT(r));
  BOOST_TEST(contains(r.out, "groups complete 64/64, entry latency p50 "), REPORT(r));
  BOOST_TEST(contains(r.out, "(1280 entries)"), REPORT(r));
  BOOST_TEST(contains(r.out, "OK: every sample arrived complete"), REPORT(r));
  BOOST_TEST(contains(r.out, "each of 2 ranks got exactly its share, and all 64 groups completed"),
             REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_routes_uneven_groups_to_three_ranks) {
  // 37 samples in groups of 5: groups 0..7, the last of 2 samples; rank
  // g mod 3 gets groups {0,3,6}, {1,4,7}, {2,5}: 15, 12 and 10 samples.
  auto r = run("rollout_to_trainer",
               {"--trainers", "3", "--group-size", "5", "--batch", "37", "--workers", "3"});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "trainer: 15/15 samples complete"), REPORT(r));
  BOOST_TEST(contains(r.out, "trainer: 12/12 samples complete"), REPORT(r));
  BOOST_TEST(contains(r.out, "trainer: 10/10 samples complete"), REPORT(r));
  BOOST_TEST(contains(r.out, "groups complete 3/3"), REPORT(r));
  BOOST_TEST(contains(r.out, "groups complete 2/2"), REPORT(r));
  BOOST_TEST(contains(r.out, "groups complete 8/8"), REPORT(r));
  BOOST_TEST(contains(r.out, "OK: every sample arrived complete"), REPORT(r));
  // Ranks in other processes are named by URL lists, not HOST:PORT.
  auto two = run("rollout_to_trainer", {"--trainers", "2", "--listen", "0"});
  BOOST_TEST(two.exit_code == 2, REPORT(two));
  BOOST_TEST(contains(two.err, "--trainers: ranks in other processes are named by URL lists"),
             REPORT(two));
  auto zero = run("rollout_to_trainer", {"--group-size", "0"});
  BOOST_TEST(zero.exit_code == 2, REPORT(zero));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_seq_len_sets_the_tokens_per_sample) {
  // 8 samples of 1000 tokens: 8 * 1000 token ids.
  auto r = run("rollout_to_trainer", {"--seq-len", "1000", "--batch", "8", "--workers", "2"});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "trainer: 4/4 samples complete"), REPORT(r));
  BOOST_TEST(contains(r.out, "  tokens 4000 (prompt "), REPORT(r));
  BOOST_TEST(contains(r.out, "OK: every sample arrived complete"), REPORT(r));
  auto bad = run("rollout_to_trainer", {"--seq-len", "0"});
  BOOST_TEST(bad.exit_code == 2, REPORT(bad));
}

BOOST_AUTO_TEST_CASE(stream_minimal_prints_each_entry_as_it_arrives) {
  auto r = run("stream_minimal", {});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "0@input_ids: 48 bytes from tcp://127.0.0.1:"), REPORT(r));
  BOOST_TEST(contains(r.out, "0@reward: 4 bytes from tcp://127.0.0.1:"), REPORT(r));
  BOOST_TEST(r.err.empty(), REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_runs_over_ucx) {
  // The same workers and trainer with UCX as the transport (UCX_TLS as the
  // environment sets it; UCX picks tcp or shared memory on loopback).
  auto r = run("rollout_to_trainer",
                {"--transport", "ucx", "--batch", "32", "--workers", "2", "--trainers", "1"});
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
  auto [t, w] = run_two_processes({"--workers", "2", "--batch", "16", "--timeout", "15"},
                                  {"--workers", "2", "--batch", "16"});
  BOOST_TEST(w.exit_code == 0, REPORT(w));
  BOOST_TEST(contains(w.out, "sent 16 blobs"), REPORT(w));
  BOOST_TEST(t.exit_code == 0, REPORT(t));
  BOOST_TEST(contains(t.out, "OK: every sample arrived complete"), REPORT(t));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_fails_when_samples_are_missing) {
  // The workers make a smaller batch than the trainer waits for.
  auto [t, w] = run_two_processes({"--workers", "1", "--batch", "8", "--timeout", "15"},
                                  {"--workers", "1", "--batch", "5"});
  BOOST_TEST(w.exit_code == 0, REPORT(w));
  BOOST_TEST(t.exit_code == 1, REPORT(t));
  BOOST_TEST(contains(t.out, "FAIL: the batch is incomplete"), REPORT(t));
  BOOST_TEST(contains(t.out, "sample 5 incomplete"), REPORT(t));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_timeout_says_what_it_waited_for) {
  // The trainer expects 2 connections, the worker process makes 1: every
  // sample arrives, then the trainer times out waiting for the second
  // connection and says so (and that the --workers counts may differ).
  // 5 s leaves room for a slow start under the sanitizers.
  auto [t, w] = run_two_processes({"--workers", "2", "--batch", "8", "--timeout", "5"},
                                  {"--workers", "1", "--batch", "8"});
  BOOST_TEST(w.exit_code == 0, REPORT(w));
  BOOST_TEST(t.exit_code == 1, REPORT(t));
  BOOST_TEST(contains(t.out, "trainer: 8/8 samples complete"), REPORT(t));
  BOOST_TEST(contains(t.out, "FAIL: timed out after 5 s waiting for worker connections: accepted "
                             "1 of the 2 expected (--workers 2), 1 of them ended; 8/8 samples "
                             "complete"),
             REPORT(t));
  BOOST_TEST(contains(t.out, "started with a smaller --workers than this trainer's 2"), REPORT(t));
  BOOST_TEST(!contains(t.out, "OK:"), REPORT(t));  // one verdict, FAIL
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_trainer_with_fewer_workers_says_so) {
  // The opposite of the timeout case: the trainer takes 2 connections, the
  // workers make 4; both accepted ones end in order and half the samples
  // never come. The trainer says why it may be, and lists only the first
  // few missing samples.
  auto [t, w] = run_two_processes({"--workers", "2", "--batch", "32", "--timeout", "30"},
                                  {"--workers", "4", "--batch", "32"});
  // Two of its workers found no trainer (exit 1): they were still in their
  // handshake when the trainer took its second worker, or not yet
  // accepted. Under load a third handshake can end in the same turn; the
  // trainer then closes that connection at once, and a plain sender cannot
  // tell that close from an orderly end (the consumer sends no close frame
  // of its own: docs/wire.md "Closing"), so that worker exits 0. The
  // trainer's verdict below is the same either way.
  BOOST_TEST((w.exit_code == 1 || w.exit_code == 0), REPORT(w));
  BOOST_TEST(t.exit_code == 1, REPORT(t));
  BOOST_TEST(contains(t.out, "trainer: 16/32 samples complete"), REPORT(t));
  BOOST_TEST(contains(t.out, "FAIL: the batch is incomplete or differs"), REPORT(t));
  BOOST_TEST(contains(t.out, "all 2 connection(s) this trainer expected (--workers 2) ended in "
                             "order, 16 samples short"),
             REPORT(t));
  BOOST_TEST(contains(t.out, "started with a larger --workers than this\n  trainer's 2"),
             REPORT(t));
  std::size_t listed = 0;
  for (std::size_t at = 0; (at = t.out.find(" incomplete: missing", at)) != std::string::npos; ++at)
    ++listed;
  BOOST_TEST(listed == 10u, REPORT(t));
  BOOST_TEST(contains(t.out, "  ... and 6 more\n"), REPORT(t));
  BOOST_TEST(!contains(t.out, "timed out"), REPORT(t));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_runs_ranks_as_separate_processes) {
  // Two rank processes and one worker process on loopback: 40 samples in
  // groups of 4 are groups 0..9; rank g mod 2 gets groups {0,2,4,6,8} and
  // {1,3,5,7,9}, 20 samples each, from all three workers.
  const std::vector<std::string> common{"--workers", "3", "--batch", "40", "--group-size", "4"};
  std::vector<std::string> rank_args = common;
  rank_args.insert(rank_args.end(), {"--timeout", "30"});
  auto c = run_cluster_processes(2, rank_args, common);
  BOOST_TEST(c.workers.exit_code == 0, REPORT(c.workers));
  BOOST_TEST(contains(c.workers.out, "3 rollout worker(s) -> 2 trainer ranks (tcp://127.0.0.1:"),
             REPORT(c.workers));
  BOOST_TEST(contains(c.workers.out, "workers: 3 worker(s) sent 40 blobs, 200 entries, "),
             REPORT(c.workers));
  for (std::size_t k = 0; k < 2; ++k) {
    const run_result& r = c.ranks[k];
    BOOST_TEST_CONTEXT("rank " << k) {
      const std::string K = std::to_string(k);
      BOOST_TEST(r.exit_code == 0, REPORT(r));
      BOOST_TEST(contains(r.out, "trainer rank " + K + " of 2 at tcp://127.0.0.1:"), REPORT(r));
      BOOST_TEST(contains(r.out, "trainer: 20/20 samples complete, 100 entries in 20 blobs"),
                 REPORT(r));
      BOOST_TEST(contains(r.out, "  rank " + K + ": "), REPORT(r));
      BOOST_TEST(contains(r.out, " MB/s, 3 connection(s), groups complete 5/5, entry latency p50 "),
                 REPORT(r));
      BOOST_TEST(contains(r.out, "(100 entries)"), REPORT(r));
      BOOST_TEST(contains(r.out, "OK: every sample arrived complete (5 keys) and identical to what "
                                 "its worker built; rank " + K + " of 2 got exactly its share, and "
                                 "all 5 of its groups completed"),
                 REPORT(r));
    }
  }
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_rank_fails_on_another_ranks_share) {
  // The worker process is given the ranks' URLs the wrong way round: every
  // sample reaches a rank that does not expect it, and each rank says so
  // and exits 1 (the workers delivered everything: exit 0).
  const std::vector<std::string> common{"--workers", "2", "--batch", "16"};
  std::vector<std::string> rank_args = common;
  rank_args.insert(rank_args.end(), {"--timeout", "30"});
  auto c = run_cluster_processes(2, rank_args, common, {1, 0});
  BOOST_TEST(c.workers.exit_code == 0, REPORT(c.workers));
  for (const run_result& r : c.ranks) {
    BOOST_TEST(r.exit_code == 1, REPORT(r));
    BOOST_TEST(contains(r.out, "trainer: 0/8 samples complete"), REPORT(r));
    BOOST_TEST(contains(r.out, ": another rank's sample"), REPORT(r));
    BOOST_TEST(!contains(r.out, "OK:"), REPORT(r));
  }
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_rank_reports_what_arrived_when_interrupted) {
  // A rank waiting for workers that never come is stopped by SIGTERM: it
  // prints its summary and fails with the signal, long before --timeout.
  process rank(example("rollout_to_trainer"),
               {"--listen", "tcp://127.0.0.1:0", "--rank", "1", "--trainers", "2", "--batch", "16",
                "--timeout", "120"});
  BOOST_TEST_REQUIRE(!rank_url(rank).empty(), rank.stdout_so_far());
  rank.signal(SIGTERM);
  auto r = rank.wait();
  BOOST_TEST(r.exit_code == 128 + SIGTERM, REPORT(r));
  BOOST_TEST(contains(r.out, "rank 1 (tcp://127.0.0.1:"), REPORT(r));
  BOOST_TEST(contains(r.out, "trainer: 0/8 samples complete"), REPORT(r));
  BOOST_TEST(contains(r.out, "groups complete 0/2"), REPORT(r));
  BOOST_TEST(contains(r.out, "FAIL: interrupted by SIGTERM"), REPORT(r));
  BOOST_TEST(!contains(r.out, "timed out"), REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_refuses_url_lists_that_do_not_fit) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--connect", "tcp://127.0.0.1:0"}, "port 0 cannot be connected to: give 1 to 65535"},
      {{"--connect", "tcp://127.0.0.1:5000,tcp://h:99999"}, "is not a number from 0 to 65535"},
      {{"--listen", "inproc://rank0"}, "inproc:// reaches only this process"},
      {{"--listen", "tcp://127.0.0.1:0", "--rank", "2", "--trainers", "2"},
       "--rank 2 with 1 URL(s) runs ranks up to 2, beyond --trainers 2"},
      {{"--connect", "tcp://127.0.0.1:5000", "--trainers", "2"},
       "--trainers 2: --connect names 1 rank(s)"},
      {{"--rank", "1"}, "--rank: only with --listen URL"},
      {{"--listen", "tcp://127.0.0.1:0", "--transport", "ucx"}, "--transport: the URLs of"},
  };
  for (const auto& [args, why] : cases) {
    BOOST_TEST_CONTEXT(args[1]) {
      auto r = run("rollout_to_trainer", args);
      BOOST_TEST(r.exit_code == 2, REPORT(r));
      BOOST_TEST(contains(r.err, why), REPORT(r));
      BOOST_TEST(r.out.empty(), REPORT(r));
    }
  }
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_names_a_different_seq_len) {
  // The workers build 200-token samples, the trainer expects 300: every
  // sample differs, and the trainer names --seq-len, not the connection
  // counts --workers and --batch.
  auto [t, w] = run_two_processes({"--workers", "1", "--batch", "4", "--seq-len", "300",
                                   "--timeout", "15"},
                                  {"--workers", "1", "--batch", "4", "--seq-len", "200"});
  BOOST_TEST(w.exit_code == 0, REPORT(w));
  BOOST_TEST(t.exit_code == 1, REPORT(t));
  BOOST_TEST(contains(t.out, "'0@input_ids': shape [200], expected [300]"), REPORT(t));
  BOOST_TEST(contains(t.out, "sample 0 arrived with 200 tokens where this side builds 300: the "
                             "workers were\n  given another --seq-len than this trainer"),
             REPORT(t));
  BOOST_TEST(!contains(t.out, "larger --workers"), REPORT(t));
}

// A plain TCP connection to 127.0.0.1:port (-1 if refused); the caller
// closes it.
int raw_connect(const std::string& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(port)));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_counts_only_connections_that_finish_their_handshake) {
  // A connection is a worker once its handshake is done: the silent one
  // and one sending garbage are not counted, and the real worker's batch
  // arrives. A trainer that took the first --workers connections, with no
  // handshake timeout, would give the one slot of --workers 1 to the
  // silent connection and refuse the real worker until --timeout.
  process trainer(example("rollout_to_trainer"),
                  {"--listen", "0", "--workers", "1", "--batch", "8", "--timeout", "30"});
  const std::string port = listening_port(trainer);
  BOOST_TEST_REQUIRE(!port.empty(), trainer.stdout_so_far());
  const int silent = raw_connect(port);
  BOOST_TEST_REQUIRE(silent >= 0);
  const int garbage = raw_connect(port);
  BOOST_TEST_REQUIRE(garbage >= 0);
  const std::string junk = "GET / HTTP/1.0\r\n\r\n";
  BOOST_TEST_REQUIRE(::write(garbage, junk.data(), junk.size()) == ssize_t(junk.size()));
  // The trainer refuses it (closes it) before the worker comes, so the
  // note below is certain.
  char b[64];
  while (::read(garbage, b, sizeof b) > 0) {
  }
  ::close(garbage);
  process workers(example("rollout_to_trainer"),
                  {"--connect", "127.0.0.1:" + port, "--workers", "1", "--batch", "8"});
  auto w = workers.wait();
  auto t = trainer.wait();
  ::close(silent);
  BOOST_TEST(w.exit_code == 0, REPORT(w));
  BOOST_TEST(t.exit_code == 0, REPORT(t));
  BOOST_TEST(contains(t.out, "OK: every sample arrived complete"), REPORT(t));
  BOOST_TEST(contains(t.out, "note: connections that failed their handshake (not counted as "
                             "workers):\n  connection 1: handshake: "),
             REPORT(t));
  BOOST_TEST(!contains(t.out, "timed out"), REPORT(t));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_listens_on_a_host_name_and_bracketed_ipv6) {
  // --listen takes the host forms --connect takes: a name (localhost
  // listens on 127.0.0.1), an IPv6 address with or without brackets.
  auto [t, w] = run_two_processes({"--workers", "1", "--batch", "4", "--timeout", "15"},
                                  {"--workers", "1", "--batch", "4"}, "localhost", "localhost");
  BOOST_TEST(t.exit_code == 0, REPORT(t));
  BOOST_TEST(contains(t.out, "tcp 127.0.0.1:"), REPORT(t));
  BOOST_TEST(w.exit_code == 0, REPORT(w));
  // IPv6 loopback, where this machine has it.
  const int s6 = ::socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a6{};
  a6.sin6_family = AF_INET6;
  a6.sin6_addr = in6addr_loopback;
  const bool have_v6 = s6 >= 0 && ::bind(s6, reinterpret_cast<sockaddr*>(&a6), sizeof a6) == 0;
  if (s6 >= 0) ::close(s6);
  if (have_v6) {
    auto [t6, w6] = run_two_processes({"--workers", "1", "--batch", "4", "--timeout", "15"},
                                      {"--workers", "1", "--batch", "4"}, "[::1]", "[::1]");
    BOOST_TEST(t6.exit_code == 0, REPORT(t6));
    BOOST_TEST(contains(t6.out, "tcp [::1]:"), REPORT(t6));
    BOOST_TEST(w6.exit_code == 0, REPORT(w6));
  } else {
    print_skip(boost::unit_test::framework::current_test_case().full_name() + " [::1]",
               "no IPv6 loopback here (binding ::1 failed): the [::1] half is not tried");
  }
  // What it cannot take is a usage error (exit 2) that says what it can;
  // a HOST with a colon is an IPv6 address or nothing (a bare "::1" is not
  // host ":" port 1).
  for (const char* bad : {"[127.0.0.1]:5000", "[::1:5000", ":5000", "::1", "a:b:5000",
                          "[x:y]:5000"}) {
    BOOST_TEST_CONTEXT(bad) {
      auto r = run("rollout_to_trainer", {"--listen", bad});
      BOOST_TEST(r.exit_code == 2, REPORT(r));
      BOOST_TEST(contains(r.err, "expected [HOST:]PORT, PORT from 0 to 65535 (PORT 0: a free "
                                 "one; HOST: a name"),
                 REPORT(r));
    }
  }
  auto c = run("rollout_to_trainer", {"--connect", "::1"});
  BOOST_TEST(c.exit_code == 2, REPORT(c));
  BOOST_TEST(contains(c.err, "--connect: expected HOST:PORT, PORT from 1 to 65535"), REPORT(c));
  // A port past 65535 (or 0 to connect to) says the range.
  for (const char* port : {"99999", "0", "65536"}) {
    BOOST_TEST_CONTEXT(port) {
      auto r = run("rollout_to_trainer", {"--connect", std::string("127.0.0.1:") + port});
      BOOST_TEST(r.exit_code == 2, REPORT(r));
      BOOST_TEST(contains(r.err, "rollout_to_trainer: --connect: port " + std::string(port) +
                                     " is out of range: give 1 to 65535"),
                 REPORT(r));
    }
  }
  auto l = run("rollout_to_trainer", {"--listen", "127.0.0.1:70000"});
  BOOST_TEST(l.exit_code == 2, REPORT(l));
  BOOST_TEST(contains(l.err, "--listen: port 70000 is out of range: give 0 to 65535"), REPORT(l));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_refuses_a_connect_host_it_cannot_reach) {
  // Said at once (exit 2), before any worker starts, instead of 5 s of
  // retries: a name that does not resolve, and IPv6 over ucx (UCX 1.13's
  // tcp transport cannot connect over it), bracketed or not.
  auto name = run("rollout_to_trainer", {"--connect", "nonexistent.invalid:5630"});
  BOOST_TEST(name.exit_code == 2, REPORT(name));
  BOOST_TEST(contains(name.err, "rollout_to_trainer: --connect: cannot resolve "
                                "'nonexistent.invalid'"),
             REPORT(name));
  BOOST_TEST(name.out.empty(), REPORT(name));
  for (const char* v6 : {"[::1]:5630", "::1:5630"}) {
    BOOST_TEST_CONTEXT(v6) {
      auto r = run("rollout_to_trainer", {"--connect", v6, "--transport", "ucx"});
      BOOST_TEST(r.exit_code == 2, REPORT(r));
      BOOST_TEST(r.err == "rollout_to_trainer: --connect: IPv6 address '::1': UCX 1.13's tcp "
                          "transport cannot connect over IPv6 (docs/ucx.md); use an IPv4 "
                          "address\n",
                 REPORT(r));
      BOOST_TEST(r.out.empty(), REPORT(r));
    }
  }
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_refuses_timeouts_out_of_range) {
  // Seconds become std::chrono::milliseconds: inf or 1e308 would overflow
  // and time out at once ("timed out after -9.22e+15 s").
  for (const char* t : {"inf", "1e10", "1e308", "1e400", "99999999999999999999", "31536000.5",
                        "0", "-5", "0.0001"}) {
    BOOST_TEST_CONTEXT(t) {
      auto r = run("rollout_to_trainer", {"--timeout", t, "--batch", "4"});
      BOOST_TEST(r.exit_code == 2, REPORT(r));
      BOOST_TEST(r.err == "rollout_to_trainer: --timeout: '" + std::string(t) +
                              "' is out of range: give 0.001 to 31536000 seconds (365 days)\n",
                 REPORT(r));
      BOOST_TEST(r.out.empty(), REPORT(r));
    }
  }
  for (const char* t : {"nan", "soon", "5s", ""}) {
    BOOST_TEST_CONTEXT(t) {
      auto r = run("rollout_to_trainer", {"--timeout", t});
      BOOST_TEST(r.exit_code == 2, REPORT(r));
      BOOST_TEST(contains(r.err, "is not a number of seconds"), REPORT(r));
    }
  }
  auto year = run("rollout_to_trainer", {"--timeout", "31536000", "--batch", "4", "--workers", "1"});
  BOOST_TEST(year.exit_code == 0, REPORT(year));
  auto help = run("rollout_to_trainer", {"--help"});
  BOOST_TEST(contains(help.out, "from 0.001 to 31536000, i.e. 365 days"), REPORT(help));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_names_an_error_once) {
  // Nobody listens: the worker gives up after its 5 s of retries and says
  // so, the code's name once (not "peer_failed (peer failed)").
  const refusing_port nobody;
  const std::string port = std::to_string(nobody.port());
  auto r = run("rollout_to_trainer", {"--connect", "127.0.0.1:" + port, "--workers", "1"});
  BOOST_TEST(r.exit_code == 1, REPORT(r));
  BOOST_TEST(r.err == "worker 0: connect to 127.0.0.1:" + port +
                          ": peer_failed: could not connect, retried for 5 s (is a trainer "
                          "listening there?)\n",
             REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_replay_of_a_dir_without_blobs_is_a_usage_error) {
  // Nothing to replay is a bad command line, not a run that sends nothing
  // and succeeds; what was found is still listed first.
  const fs::path dir = scratch_dir() / "replay_none_invalid";
  fs::create_directories(dir);
  auto r = run("rollout_to_trainer", {"--replay", dir.string()});
  BOOST_TEST(r.exit_code == 2, REPORT(r));
  BOOST_TEST(contains(r.out, "replay: 0 valid blobs in " + dir.string() +
                                 " (0 entries, 0 bytes); no invalid ones\n"),
             REPORT(r));
  BOOST_TEST(!contains(r.out, "invalid:"), REPORT(r));
  BOOST_TEST(contains(r.err, "no valid *.blob file to replay"), REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_rejects_bad_flags) {
  auto rdma = run("rollout_to_trainer", {"--transport", "rdma"});
  BOOST_TEST(rdma.exit_code == 2, REPORT(rdma));
  BOOST_TEST(contains(rdma.err, "unknown transport 'rdma'"), REPORT(rdma));
  auto dir = run("rollout_to_trainer", {"--replay", (scratch_dir() / "no_such_dir").string()});
  BOOST_TEST(dir.exit_code == 2, REPORT(dir));
  // A flag given last without its value says so (not "expected a positive number").
  auto bare = run("rollout_to_trainer", {"--batch"});
  BOOST_TEST(bare.exit_code == 2, REPORT(bare));
  BOOST_TEST(contains(bare.err, "--batch: needs a value"), REPORT(bare));
  auto zero = run("rollout_to_trainer", {"--batch", "0"});
  BOOST_TEST(contains(zero.err, "--batch: expected a positive number"), REPORT(zero));
  auto help = run("rollout_to_trainer", {"--help"});
  BOOST_TEST(help.exit_code == 0, REPORT(help));
  BOOST_TEST(contains(help.out, "--replay DIR"), REPORT(help));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_reports_what_arrived_when_interrupted) {
  // A trainer waiting for workers that never come is stopped by SIGTERM:
  // it prints its summary and fails with the signal, long before --timeout.
  process trainer(example("rollout_to_trainer"),
                  {"--listen", "0", "--workers", "1", "--batch", "8", "--timeout", "120"});
  // The banner comes once the trainer listens and its signal handler is set.
  BOOST_TEST_REQUIRE(!listening_port(trainer).empty(), trainer.stdout_so_far());
  trainer.signal(SIGTERM);
  auto t = trainer.wait();
  BOOST_TEST(t.exit_code == 128 + SIGTERM, REPORT(t));
  BOOST_TEST(contains(t.out, "trainer: 0/8 samples complete"), REPORT(t));
  BOOST_TEST(contains(t.out, "FAIL: interrupted by SIGTERM"), REPORT(t));
  BOOST_TEST(!contains(t.out, "timed out"), REPORT(t));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_refuses_more_workers_than_descriptors) {
  // With at most 100 descriptors, 1000 in-process workers cannot connect:
  // a usage error up front instead of failed accepts and stuck connects.
  const auto limited = [](const char* soft, std::vector<std::string> args) {
    // sh -c SCRIPT EXE ARGS...: the script sees EXE as $0, ARGS as "$@".
    std::vector<std::string> all{"-c", std::string("ulimit -S -n ") + soft +
                                           " && ulimit -H -n 100 && exec \"$0\" \"$@\"",
                                 example("rollout_to_trainer").string()};
    all.insert(all.end(), args.begin(), args.end());
    return run_process("/bin/sh", all);
  };
  auto r = limited("64", {"--workers", "1000"});
  BOOST_TEST(r.exit_code == 2, REPORT(r));
  BOOST_TEST(contains(r.err, "--workers 1000 x --trainers 2"), REPORT(r));
  BOOST_TEST(contains(r.err, "needs about"), REPORT(r));
  BOOST_TEST(contains(r.err, "hard limit 100"), REPORT(r));
  BOOST_TEST(r.out.empty(), REPORT(r));  // refused before anything ran
  // 10 workers fit once the soft limit is raised to the hard one.
  auto ok = limited("20", {"--workers", "10", "--batch", "20", "--trainers", "1"});
  BOOST_TEST(ok.exit_code == 0, REPORT(ok));
}

BOOST_AUTO_TEST_CASE(examples_fail_when_stdout_cannot_be_written) {
  // Like coreutils: output to a full device (/dev/full) is a failure with a
  // line on stderr, for --help and for a whole run.
  for (const char* name : {"rollout_to_trainer", "custom_pipeline"}) {
    BOOST_TEST_CONTEXT(name) {
      auto help = run_process(example(name), {"--help"}, "/dev/full");
      BOOST_TEST(help.exit_code == 1, REPORT(help));
      BOOST_TEST(help.err == std::string(name) + ": write error: No space left on device\n",
                 REPORT(help));
    }
  }
  // A whole run fails to write long before the end (the banner is flushed
  // first): std::cout keeps no reason for that, only that it failed.
  auto r = run_process(example("custom_pipeline"), {}, "/dev/full");
  BOOST_TEST(r.exit_code == 1, REPORT(r));
  BOOST_TEST(contains(r.err, "custom_pipeline: write error"), REPORT(r));
  auto t = run_process(example("rollout_to_trainer"), {"--batch", "4", "--workers", "1"},
                       "/dev/full");
  BOOST_TEST(t.exit_code == 1, REPORT(t));
  BOOST_TEST(contains(t.err, "rollout_to_trainer: write error"), REPORT(t));
}

BOOST_AUTO_TEST_CASE(custom_pipeline_filters_and_casts) {
  auto r = run("custom_pipeline", {});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "sample dropped"), REPORT(r));
  BOOST_TEST(contains(r.out, "float32 -> bfloat16"), REPORT(r));
  BOOST_TEST(contains(r.out, "bfloat16["), REPORT(r));
}

BOOST_AUTO_TEST_CASE(custom_pipeline_rejects_arguments_but_help) {
  auto bad = run("custom_pipeline", {"--samples", "3"});
  BOOST_TEST(bad.exit_code == 2, REPORT(bad));
  BOOST_TEST(contains(bad.err, "unknown argument '--samples'"), REPORT(bad));
  BOOST_TEST(contains(bad.err, "usage: custom_pipeline"), REPORT(bad));
  BOOST_TEST(bad.out.empty(), REPORT(bad));  // refused before anything ran
  auto mixed = run("custom_pipeline", {"--help", "extra"});
  BOOST_TEST(mixed.exit_code == 2, REPORT(mixed));
  BOOST_TEST(contains(mixed.err, "unknown argument 'extra'"), REPORT(mixed));
  auto help = run("custom_pipeline", {"--help"});
  BOOST_TEST(help.exit_code == 0, REPORT(help));
  BOOST_TEST(contains(help.out, "usage: custom_pipeline"), REPORT(help));
  BOOST_TEST(contains(help.out, "exit status"), REPORT(help));
}

// ---- the digest check, the steady-state rate, CPU seconds --------------

// A run of `args` that must fail its check: exit 1, no OK line, and `why`
// in its output.
void expect_check_failure(const std::vector<std::string>& args, const std::string& why) {
  auto r = run("rollout_to_trainer", args);
  BOOST_TEST(r.exit_code == 1, REPORT(r));
  BOOST_TEST(contains(r.out, "FAIL: the batch is incomplete or differs"), REPORT(r));
  BOOST_TEST(contains(r.out, why), REPORT(r));
  BOOST_TEST(!contains(r.out, "OK: "), REPORT(r));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_digest_check_fails_on_a_corrupted_entry) {
  // One bit of one entry flipped by its worker: the digest (the default
  // check) names the entry, at either shape (ranks, one trainer).
  expect_check_failure({"--batch", "16", "--workers", "2", "--corrupt-sample", "5"},
                       "'5@generation_logprobs': digest differs");
  expect_check_failure(
      {"--batch", "16", "--workers", "2", "--trainers", "1", "--corrupt-sample", "9"},
      "'9@generation_logprobs': digest differs");
  // Unchanged data passes the same check.
  auto ok = run("rollout_to_trainer", {"--batch", "16", "--workers", "2", "--check", "digest"});
  BOOST_TEST(ok.exit_code == 0, REPORT(ok));
  BOOST_TEST(contains(ok.out, "  checked: each entry's kind, dtype, shape and 64-bit digest "
                              "(--check digest)"),
             REPORT(ok));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_full_check_fails_on_a_corrupted_entry) {
  expect_check_failure(
      {"--batch", "16", "--workers", "2", "--check", "full", "--corrupt-sample", "5"},
      "'5@generation_logprobs': bytes differ");
  auto ok = run("rollout_to_trainer", {"--batch", "16", "--workers", "2", "--check", "full"});
  BOOST_TEST(ok.exit_code == 0, REPORT(ok));
  BOOST_TEST(contains(ok.out, "  checked: each entry's kind, dtype, shape and bytes against a "
                              "rebuilt sample (--check full)"),
             REPORT(ok));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_fails_on_a_missing_entry_with_either_check) {
  for (const char* mode : {"digest", "full"}) {
    BOOST_TEST_CONTEXT("--check " << mode) {
      expect_check_failure(
          {"--batch", "16", "--workers", "2", "--check", mode, "--drop-entry", "6"},
          "sample 6 incomplete: missing token_mask");
    }
  }
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_digest_check_fails_across_processes) {
  // The workers of another process damage a sample; the trainer's digest
  // check catches it there.
  auto [t, w] = run_two_processes({"--workers", "1", "--batch", "8", "--timeout", "15"},
                                  {"--workers", "1", "--batch", "8", "--corrupt-sample", "3"});
  BOOST_TEST(w.exit_code == 0, REPORT(w));
  BOOST_TEST(t.exit_code == 1, REPORT(t));
  BOOST_TEST(contains(t.out, "'3@generation_logprobs': digest differs"), REPORT(t));
}

BOOST_AUTO_TEST_CASE(rollout_to_trainer_prints_steady_rate_and_cpu_seconds) {
  auto r = run("rollout_to_trainer", {"--batch", "64", "--workers", "2"});
  BOOST_TEST(r.exit_code == 0, REPORT(r));
  BOOST_TEST(contains(r.out, "global batch 64 samples"), REPORT(r));
  BOOST_TEST(contains(r.out, "  tokens 131072 (prompt "), REPORT(r));  // 64 x 4096 by default
  BOOST_TEST(contains(r.out, ", first entry after "), REPORT(r));
  BOOST_TEST(contains(r.out, "steady state (samples 10-90 %): "), REPORT(r));
  BOOST_TEST(contains(r.out, "cpu (trainer and workers): "), REPORT(r));
  BOOST_TEST(contains(r.out, " s wall; in the example's own work: the trainer's checks "),
             REPORT(r));
  BOOST_TEST(contains(r.out, " s, sample building "), REPORT(r));
  auto bad = run("rollout_to_trainer", {"--check", "sha"});
  BOOST_TEST(bad.exit_code == 2, REPORT(bad));
  BOOST_TEST(contains(bad.err, "--check: expected digest or full"), REPORT(bad));
}
