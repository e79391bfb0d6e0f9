// examples/rollout/options.cpp — see options.hpp.
#include "examples/rollout/options.hpp"

#include <charconv>
#include <cmath>
#include <optional>
#include <string_view>
#include <system_error>

#include <asio/ip/address_v6.hpp>

#include "blobpipe/errors.hpp"
#include "blobpipe/transport/url.hpp"

namespace rollout {
namespace {

template <class T>
bool parse_number(std::string_view s, T& out) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc{} && end == s.data() + s.size();
}

// "[HOST:]PORT" (--listen) or "HOST:PORT" (--connect). HOST is a name, an
// IPv4 or IPv6 address, or an IPv6 address in brackets ([::1]:5555); the
// last colon ends it. A HOST with a colon must be an IPv6 address, so a
// bare "::1" (no port) is refused rather than read as ":" port 1.
// Returns why not, or nothing when parsed.
std::optional<std::string> parse_endpoint(std::string_view s, bool connecting, options& o) {
  const std::string form =
      connecting ? "expected HOST:PORT, PORT from 1 to 65535 (HOST: a name, an IP address, or "
                   "[IPv6]), or URL[,URL...]"
                 : "expected [HOST:]PORT, PORT from 0 to 65535 (PORT 0: a free one; HOST: a "
                   "name, an IP address, or [IPv6]), or URL[,URL...]";
  std::size_t colon = s.rfind(':');
  std::string_view port = colon == std::string_view::npos ? s : s.substr(colon + 1);
  // A port that is a number but out of range says so, with the range.
  unsigned long long wide = 0;
  if (parse_number(port, wide) && (wide > 65535 || (connecting && wide == 0)))
    return "port " + std::string(port) + " is out of range: give " + (connecting ? "1" : "0") +
           " to 65535 (" + form + ")";
  if (colon == std::string_view::npos) {
    if (connecting || !parse_number(s, o.port)) return form;
    return std::nullopt;
  }
  std::string_view host = s.substr(0, colon);
  const bool bracketed = host.starts_with('[') && host.ends_with(']') && host.size() > 2;
  if (bracketed) host = host.substr(1, host.size() - 2);
  if (host.empty() || host.find_first_of("[] ") != std::string_view::npos) return form;
  if (bracketed || host.find(':') != std::string_view::npos) {
    std::error_code ec;
    (void)asio::ip::make_address_v6(std::string(host), ec);
    if (ec) return form;  // brackets, or a colon, hold an IPv6 address
  }
  o.host = std::string(host);
  if (!parse_number(port, o.port)) return form;
  return std::nullopt;
}

// "URL[,URL...]" (a --listen or --connect value holding "://"): each URL as
// blobpipe::parse_url takes it (its message names the part), not inproc://
// (the other process cannot reach it), and port 0 only when listening.
std::optional<std::string> parse_url_list(std::string_view s, bool connecting,
                                          std::vector<std::string>& out) {
  out.clear();
  for (std::size_t at = 0;;) {
    const std::size_t comma = s.find(',', at);
    const std::string_view one = s.substr(at, comma == std::string_view::npos ? comma : comma - at);
    auto u = blobpipe::parse_url(one);
    if (!u) return u.message();
    if (u->scheme == blobpipe::url_scheme::inproc)
      return blobpipe::quote(one) + ": inproc:// reaches only this process; give tcp:// or ucx://";
    if (connecting && u->port == 0)
      return blobpipe::quote(one) + ": port 0 cannot be connected to: give 1 to 65535";
    out.push_back(u->str());
    if (comma == std::string_view::npos) return std::nullopt;
    at = comma + 1;
  }
}

}  // namespace

const char* help_text() noexcept {
  return R"(usage: rollout_to_trainer [options]

Streams RL rollout samples as NVDP blobs from rollout workers to a trainer
over TCP, the way NeMo RL's data plane keys them ({n}@input_ids,
{n}@generation_logprobs, {n}@token_mask, {n}@reward, {n}@meta). With no
options, 4 worker coroutines and 2 trainer ranks run in this process over
127.0.0.1 on ephemeral ports; each GRPO group of 4 samples goes to one
rank, the ranks gather a batch of 8192 samples of 4096 tokens (53 KB,
437 MB in all) between them, check every entry against the data the
workers built, and print throughput, the time to first entry, the
steady-state rate, entry latency, the groups completed and the CPU
seconds of the checks, of building samples and of the rest.

options:
  --workers N         rollout-worker connections (default 4)
  --batch N           samples in the global batch (default 8192 in one
                      process, 256 with --listen/--connect)
  --check MODE        digest (default): the trainer compares a 64-bit
                      digest of each entry's bytes with the digest of
                      what the worker built (kept per corpus row, so no
                      sample is rebuilt); full: each entry byte for byte
                      with a rebuilt sample. Either checks kind, dtype and
                      shape, and fails the run on any difference
  --replay DIR        stream every valid *.blob of DIR instead of samples
                      (entries with their keys, dtypes, shapes and the
                      blob's tag); the trainer compares every entry with
                      the file's bytes
  --listen [HOST:]PORT  run only the trainer, listening there; it expects
                      --workers connections (PORT 0 to 65535; 0: a free
                      port, named in the first line of output). HOST
                      (default 127.0.0.1) is an IPv4 address, an IPv6
                      address (::1, or [::1] with brackets), or a host
                      name, which listens on its first IPv4 address
                      (localhost: 127.0.0.1); ucx takes IPv4 only
  --listen URL[,URL...]  run only trainer ranks, one fan-in server per URL
                      (tcp://HOST:PORT or ucx://HOST:PORT, e.g.
                      tcp://0.0.0.0:5555; port 0: a free one, named in the
                      first line): ranks R, R+1, ... of --trainers K
                      (default: R + the number of URLs); each expects
                      --workers worker connections, checks it got exactly
                      its share (the groups g with g mod K = its rank) and
                      ends when they have ended
  --rank R            with --listen URL...: the rank of its first URL (default 0)
  --connect HOST:PORT run only the rollout workers, connecting there
                      (HOST as for --listen; PORT 1 to 65535; a name is
                      tried at each of its addresses; a refused connection
                      is retried for 5 s while the trainer starts); give
                      both sides the same --workers, --batch and --replay
  --connect URL[,URL...]  run only the rollout workers, routing GRPO group g
                      to the (g mod K)-th URL (K URLs: ranks 0 .. K-1, as
                      the --listen processes were given them); each worker
                      is a resend session to every rank, retried for about
                      5 s while the ranks start (10 attempts; a rank that
                      accepts and never answers costs each attempt up to
                      10 s, the handshake bound: the error says how long
                      it tried, and the bound). Give every process the
                      same --workers, --batch, --group-size and --seq-len
  --transport NAME    tcp (default) or ucx (UCX_TLS picks UCX's transports; docs/ucx.md)
  --timeout SECONDS   the trainer gives up after this long, and a worker
                      once the trainer has taken nothing for this long
                      (default 60; from 0.001 to 31536000, i.e. 365 days)
  --trainers K        K trainer ranks, each a fan-in server (blobpipe::server);
                      each worker routes GRPO group g to rank g mod K
                      (blobpipe::router), every rank checks it got exactly
                      its share, and the run prints per-rank and total
                      throughput, entry latency percentiles and the groups
                      completed (default 2 when everything runs in this
                      process, the URLs' count with --listen/--connect URL
                      lists, else 1; K > 1 not with --replay)
  --group-size G      samples per GRPO group: samples gG .. gG+G-1 (default 4)
  --seq-len N         N tokens per sample (token ids int64, logprobs float32,
                      mask: 13 N bytes; the response repeated or cut to fit;
                      default 4096 in one process, else the corpus text,
                      about 80, as the Python example builds); give both
                      sides of a --listen/--connect run the same N (a
                      trainer that gets other lengths says so)
  --corrupt-sample N  (to test the check) the workers flip a bit of
                      sample N's generation_logprobs after building it
  --drop-entry N      (to test the check) the workers leave out sample N's
                      token_mask entry
  --help              this text

exit status: 0 every sample (or replayed blob) arrived complete and
identical (every rank its exact share); 1 something was missing or
different, a group did not complete, a connection failed, or
stdout could not be written; 2 bad command line (also a --listen or
--connect HOST that does not resolve or that the transport refuses, a
--replay DIR without a valid blob, or more --workers than the process may
open connections for); 130 / 143 interrupted by SIGINT / SIGTERM (the
trainer first prints what had arrived; a second signal ends it at once).
With --connect, 0 means every sample was delivered and acknowledged; only
the trainer checks the data.
)";
}

std::variant<options, usage_error> parse_options(int argc, const char* const* argv) {
  options o;
  bool listen = false, connect = false, trainers_given = false, rank_given = false,
       transport_given = false, batch_given = false, seq_len_given = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view name = arg, val;
    bool has_val = false;
    if (auto eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      val = arg.substr(eq + 1);
      has_val = true;
    }
    bool missing = false;  // the option's value is not there at all
    auto need = [&]() -> bool {
      if (has_val) return true;
      if (i + 1 >= argc) {
        missing = true;
        return false;
      }
      val = argv[++i];
      return true;
    };
    auto bad = [&](std::string why) {
      return usage_error{std::string(name) + ": " + (missing ? "needs a value" : why)};
    };

    if (name == "--help" || name == "-h") {
      o.help = true;
      return o;
    } else if (name == "--workers") {
      if (!need() || !parse_number(val, o.workers) || o.workers == 0)
        return bad("expected a positive number");
    } else if (name == "--batch") {
      if (!need() || !parse_number(val, o.batch) || o.batch == 0)
        return bad("expected a positive number");
      batch_given = true;
    } else if (name == "--trainers") {
      if (!need() || !parse_number(val, o.trainers) || o.trainers == 0)
        return bad("expected a positive number");
      trainers_given = true;
    } else if (name == "--group-size") {
      if (!need() || !parse_number(val, o.group_size) || o.group_size == 0)
        return bad("expected a positive number");
    } else if (name == "--seq-len") {
      if (!need() || !parse_number(val, o.seq_len) || o.seq_len == 0 || o.seq_len > (1u << 24))
        return bad("expected a number of tokens from 1 to 16777216");
      seq_len_given = true;
    } else if (name == "--check") {
      if (!need() || (val != "digest" && val != "full"))
        return bad("expected digest or full");
      o.check = val == "digest" ? check_mode::digest : check_mode::full;
    } else if (name == "--corrupt-sample" || name == "--drop-entry") {
      std::size_t n = 0;
      if (!need() || !parse_number(val, n)) return bad("expected a sample number (0 ..)");
      (name == "--drop-entry" ? o.drop_entry : o.corrupt_sample) = n;
    } else if (name == "--replay") {
      if (!need() || val.empty()) return bad("expected a directory");
      o.replay_dir = std::string(val);
    } else if (name == "--listen" || name == "--connect") {
      const bool connecting = name == "--connect";
      if (!need()) val = {};
      auto& urls = connecting ? o.connect_urls : o.listen_urls;
      const auto why = val.find("://") != std::string_view::npos
                           ? parse_url_list(val, connecting, urls)
                           : parse_endpoint(val, connecting, o);
      if (why) return bad(*why);
      (connecting ? connect : listen) = true;
    } else if (name == "--rank") {
      if (!need() || !parse_number(val, o.first_rank)) return bad("expected a rank number (0 ..)");
      rank_given = true;
    } else if (name == "--transport") {
      if (!need()) return bad("expected a transport name");
      transport_given = true;
      if (val != "tcp" && val != "ucx")
        return bad("unknown transport '" + std::string(val) + "' (supported: tcp, ucx)");
      o.transport = std::string(val);
    } else if (name == "--timeout") {
      // inf, nan, 1e400 (out of range for from_chars) and the like would
      // overflow the timers' milliseconds: refuse them, naming the range.
      double t = 0;
      if (!need()) return bad("expected a number of seconds");
      auto [end, ec] = std::from_chars(val.data(), val.data() + val.size(), t);
      const bool number = end == val.data() + val.size() &&
                          (ec == std::errc{} || ec == std::errc::result_out_of_range);
      if (!number || std::isnan(t))
        return bad("'" + std::string(val) + "' is not a number of seconds");
      static_assert(min_timeout_s == 0.001 && max_timeout_s == 31536000, "as --help says");
      if (ec != std::errc{} || !std::isfinite(t) || t < min_timeout_s || t > max_timeout_s)
        return bad("'" + std::string(val) +
                   "' is out of range: give 0.001 to 31536000 seconds (365 days)");
      o.timeout_s = t;
    } else {
      return usage_error{"unknown option '" + std::string(arg) + "' (see --help)"};
    }
  }
  if (listen && connect) return usage_error{"--listen and --connect run different processes; give one"};
  o.mode = listen ? role::trainer : connect ? role::workers : role::both;
  // The run of one process measures something: a few hundred MB of
  // samples at a realistic length (8192 x 53 KB). Two processes keep the
  // sizes the Python example builds, so either side can be Python.
  if (o.mode == role::both && !o.replay_dir) {
    if (!batch_given) o.batch = 8192;
    if (!seq_len_given) o.seq_len = 4096;
  }
  const bool urls = !o.listen_urls.empty() || !o.connect_urls.empty();
  if (urls && transport_given)
    return usage_error{"--transport: the URLs of --listen/--connect name their transport "
                       "(tcp://, ucx://); give one or the other"};
  if (urls && o.replay_dir)
    return usage_error{"--replay: the ranks of --listen/--connect URL lists check samples; "
                       "replay with --listen/--connect HOST:PORT"};
  if (rank_given && o.listen_urls.empty())
    return usage_error{"--rank: only with --listen URL[,URL...] (the rank of its first URL)"};
  if (!o.connect_urls.empty()) {
    // The workers route to as many ranks as they are given URLs.
    if (trainers_given && o.trainers != o.connect_urls.size())
      return usage_error{"--trainers " + std::to_string(o.trainers) + ": --connect names " +
                         std::to_string(o.connect_urls.size()) + " rank(s); give one URL per rank"};
    o.trainers = o.connect_urls.size();
  } else if (!o.listen_urls.empty()) {
    const std::size_t last = o.first_rank + o.listen_urls.size();
    if (!trainers_given) o.trainers = last;
    if (last > o.trainers)
      return usage_error{"--rank " + std::to_string(o.first_rank) + " with " +
                         std::to_string(o.listen_urls.size()) + " URL(s) runs ranks up to " +
                         std::to_string(last - 1) + ", beyond --trainers " +
                         std::to_string(o.trainers) + " (ranks 0 .. " +
                         std::to_string(o.trainers - 1) + ")"};
  } else if (!trainers_given) {
    o.trainers = o.mode == role::both && !o.replay_dir ? 2 : 1;
  }
  if (o.trainers > 1 && o.replay_dir)
    return usage_error{"--trainers: one trainer replays (not more ranks with --replay)"};
  if (o.trainers > 1 && o.mode != role::both && !urls)
    return usage_error{"--trainers: ranks in other processes are named by URL lists: "
                       "--listen URL --rank R per rank, --connect URL0,URL1,..."};
  return o;
}

}  // namespace rollout
