// examples/rollout/options.hpp — the command line of rollout_to_trainer.
//
//   auto parsed = rollout::parse_options(argc, argv);
//   if (auto* e = std::get_if<rollout::usage_error>(&parsed)) ...
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace rollout {

inline constexpr int exit_ok = 0;
inline constexpr int exit_mismatch = 1;  ///< data missing, different, or a stream error
inline constexpr int exit_usage = 2;     ///< bad command line

/// Which sides this process runs.
enum class role {
  both,     ///< trainer and workers in one process (default)
  trainer,  ///< --listen: the trainer (or trainer ranks) alone
  workers,  ///< --connect: the rollout workers alone
};

/// How the trainer checks a sample (--check).
enum class check_mode {
  /// The digest64 (digest.hpp) of each entry's bytes against the digest
  /// of what the worker built, from the builder's pool (default).
  digest,
  /// Each entry byte for byte against a rebuilt copy of the sample.
  full,
};

struct options {
  bool help = false;
  role mode = role::both;
  std::size_t workers = 4;     ///< rollout-worker connections
  /// Samples in the global batch. Not given: 8192 when trainer and
  /// workers run in this process without --replay (a few hundred MB at
  /// the default --seq-len), else 256 (as the Python example's default).
  std::size_t batch = 256;
  std::optional<std::string> replay_dir;  ///< stream the blobs of this directory
  std::string host = "127.0.0.1";  ///< --listen address / --connect host
  std::uint16_t port = 0;      ///< 0: an ephemeral port (role::both, or --listen 0)
  std::string transport = "tcp";
  double timeout_s = 60;       ///< the trainer gives up after this long
  /// Trainer ranks (--trainers K): with K > 1 each rank is a fan-in server
  /// in this process and every worker routes GRPO group g to rank g mod K
  /// (examples/rollout/cluster.hpp). Not given: 2 when trainer and
  /// workers run in this process without --replay, else 1.
  std::size_t trainers = 1;
  std::size_t group_size = 4;  ///< samples per GRPO group (--group-size G)
  /// Tokens per sample (--seq-len N; 0: as the corpus text is, about 80).
  /// Not given: 4096 when trainer and workers run in this process without
  /// --replay, else 0 (what the Python example builds).
  std::size_t seq_len = 0;
  check_mode check = check_mode::digest;  ///< --check digest|full
  /// For tests of the check: the workers damage sample N (sample.hpp's
  /// corrupt()) after building it (--corrupt-sample N), or leave out its
  /// token_mask entry (--drop-entry N).
  std::optional<std::size_t> corrupt_sample, drop_entry;
  /// --listen URL[,URL...]: this process runs only trainer ranks, a fan-in
  /// server at each URL: ranks first_rank .. first_rank + n - 1 of
  /// `trainers` (examples/rollout/cluster.hpp).
  std::vector<std::string> listen_urls;
  /// --connect URL[,URL...]: this process runs only workers, which route
  /// GRPO group g to connect_urls[g mod K] (K = trainers = their number).
  std::vector<std::string> connect_urls;
  std::size_t first_rank = 0;  ///< --rank R: the rank of listen_urls[0]
};

/// True when the ranks are fan-in servers and the workers routers
/// (cluster.hpp): several ranks, or ranks named by URL lists.
inline bool cluster_shape(const options& o) {
  return o.trainers > 1 || !o.listen_urls.empty() || !o.connect_urls.empty();
}

/// --timeout's range in seconds: from a millisecond (the timers' unit) to
/// a year (365 days; far inside std::chrono::milliseconds).
inline constexpr double min_timeout_s = 0.001;
inline constexpr double max_timeout_s = 365.0 * 24 * 3600;

/// --timeout as the timers take it (REQUIRES: within the range above).
inline std::chrono::milliseconds timeout_ms(const options& o) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(o.timeout_s * 1e3));
}

struct usage_error {
  std::string message;  ///< one line
};

/// Parses argv (`--flag N` and `--flag=N`). Refuses unknown flags, a --transport other than tcp or
/// ucx, a --check other than digest or full, --listen with --connect, zero counts, a --timeout
/// outside [min_timeout_s, max_timeout_s] (inf and nan too), a port outside 0..65535 (1..65535 for
/// --connect), a URL list that parse_url refuses (its message) or that names inproc:// (another
/// process cannot reach it), and --rank/--trainers that do not fit the lists.
std::variant<options, usage_error> parse_options(int argc, const char* const* argv);

/// What --help prints.
const char* help_text() noexcept;

}  // namespace rollout
