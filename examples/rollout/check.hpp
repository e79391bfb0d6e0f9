// examples/rollout/check.hpp — what the trainer does with what arrives.
//
// The trainer hands every consumer event to one checker. The batch check
// knows which samples make up the global batch and compares each entry
// that arrives with what its worker built: by default its digest
// (digest.hpp) against the builder's digest of that entry (check_mode::
// digest: one pass over the bytes, no sample rebuilt), or byte for byte
// against a rebuilt sample (check_mode::full); the replay check compares
// each entry with the bytes of the file it came from. Both keep nothing
// that arrived: an entry is looked at, counted and released at once, so
// its window credit goes straight back to the worker that sent it.
//
//   auto c = rollout::make_batch_check(builder, 256);
//   c->on_entry(conn, *ev.entry);   // ... for every event
//   bool ok = c->report(std::cout);
//   if (ok) std::cout << "OK: " << c->ok_text() << "\n";
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "blobpipe/pipeline/consumer.hpp"
#include "examples/rollout/options.hpp"
#include "examples/rollout/replay.hpp"
#include "examples/rollout/sample.hpp"

namespace rollout {

/// One line for a blob_aborted event (its reason says why: the producer's
/// words or what broke). The reason is the peer's text, escaped
/// (blobpipe::escape): it can neither end the line nor forge another.
inline std::string describe_abort(const blobpipe::event& ev) {
  return "blob " + blobpipe::tag_hex(ev.tag) + " aborted: " + blobpipe::escape(ev.reason);
}

class checker {
 public:
  virtual ~checker() = default;

  /// An entry of a blob on connection `conn` (blob ids are per connection).
  virtual void on_entry(std::size_t conn, const blobpipe::received_entry& e) = 0;
  /// A blob's tail arrived and agreed with its entries.
  virtual void on_blob(std::size_t conn, const blobpipe::completed_blob& b,
                       const blobpipe::tag_t& tag) = 0;
  /// A blob will never complete.
  virtual void on_aborted(std::size_t conn, const blobpipe::event& ev) = 0;

  /// Progress: units (samples or blobs) complete, out of total.
  virtual std::uint64_t done() const noexcept = 0;
  virtual std::uint64_t total() const noexcept = 0;
  virtual const char* unit() const noexcept = 0;
  /// Entries and entry bytes seen so far.
  virtual std::uint64_t entries() const noexcept = 0;
  virtual std::uint64_t bytes() const noexcept = 0;

  /// True when something arrived that differs from what was expected (not
  /// only missing): the two sides built different data (say, another
  /// --seq-len), so a hint about connection counts would mislead.
  virtual bool differs() const noexcept { return false; }

  /// Prints what arrived and, when something is missing or different, a
  /// FAIL line and what went wrong; true when everything expected arrived,
  /// complete and identical, and nothing else did.
  virtual bool report(std::ostream& out) const = 0;
  /// What a true report() means, for the caller's one "OK: ..." line: it
  /// prints that only when the whole run passed (not, say, when the data
  /// was all there but the trainer then timed out waiting for a connection).
  virtual std::string ok_text() const = 0;
};

/// Checks samples 0 .. batch-1, five entries each (sample.hpp): kind,
/// dtype and shape, and the bytes as `mode` says. With `mine`, only the
/// samples n for which mine(n) holds are expected (a rank's share); any
/// other sample arriving is a problem.
std::unique_ptr<checker> make_batch_check(std::shared_ptr<const sample_builder> builder,
                                          std::size_t batch,
                                          std::function<bool(std::size_t)> mine = {},
                                          check_mode mode = check_mode::digest);

/// Checks that every blob of `set` arrives once, byte for byte.
std::unique_ptr<checker> make_replay_check(std::shared_ptr<const replay_set> set);

/// A bounded list of problems (the first few are kept verbatim).
class problem_log {
 public:
  void add(std::string what);
  bool empty() const noexcept { return count_ == 0; }
  void print(std::ostream& out) const;

 private:
  static constexpr std::size_t kept = 10;
  std::vector<std::string> first_;
  std::uint64_t count_ = 0;
};

}  // namespace rollout
