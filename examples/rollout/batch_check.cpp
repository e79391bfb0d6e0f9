// examples/rollout/batch_check.cpp — the trainer's check of a sample batch.
#include <bit>
#include <bitset>
#include <cstring>
#include <iomanip>
#include <optional>

#include "examples/rollout/check.hpp"
#include "examples/rollout/digest.hpp"

namespace rollout {
namespace {

using blobpipe::received_entry;

// What the trainer learns from the data itself (it reads the values the
// way a loss would: mask, logprobs, reward).
struct batch_stats {
  std::uint64_t tokens = 0;
  std::uint64_t response_tokens = 0;
  double logprob_sum = 0;  // prompt logprobs are 0, so this is the response's
  double reward_sum = 0;
  std::uint64_t rewards = 0;
};

class batch_check final : public checker {
 public:
  batch_check(std::shared_ptr<const sample_builder> b, std::size_t batch,
              const std::function<bool(std::size_t)>& mine, check_mode mode)
      : builder_(std::move(b)), slots_(batch), mode_(mode) {
    for (std::size_t n = 0; n < batch; ++n) {
      slots_[n].mine = !mine || mine(n);
      expected_ += slots_[n].mine;
    }
  }

  void on_entry(std::size_t, const received_entry& e) override {
    ++entries_;
    bytes_ += e.entry.len;
    auto k = parse_sample_key(e.entry.key);
    if (!k || static_cast<std::uint64_t>(k->idx) >= slots_.size()) {
      problems_.add("unexpected key " + blobpipe::quote(e.entry.key));
      return;
    }
    slot& s = slots_[static_cast<std::size_t>(k->idx)];
    if (!s.mine) {
      problems_.add(blobpipe::quote(e.entry.key) + ": another rank's sample");
      return;
    }
    if (s.got.test(k->field)) {
      problems_.add(blobpipe::quote(e.entry.key) + ": arrived twice");
      return;
    }
    // What the worker built (deterministic), once the sample's first entry
    // arrives: its digests, or the whole sample rebuilt (--check full);
    // dropped when the sample is complete.
    std::optional<std::string> why;
    if (mode_ == check_mode::digest) {
      if (!s.expect) s.expect = builder_->expect(k->idx);
      why = compare_digest(e, k->field, *s.expect);
    } else {
      if (!s.expected) s.expected = builder_->make(k->idx);
      if (!s.expect) s.expect = expectation{.tokens = s.expected->input_ids.size()};
      why = compare(e, fields(*s.expected)[k->field]);
    }
    if (why) {
      problems_.add(blobpipe::quote(e.entry.key) + ": " + *why);
      differs_ = true;
      note_length(e, k->idx, s.expect->tokens);
      return;
    }
    s.got.set(k->field);
    learn(e, k->field);
    if (s.got.all()) {
      ++complete_;
      s.expected.reset();
      s.expect.reset();
    }
  }

  void on_blob(std::size_t, const blobpipe::completed_blob&, const blobpipe::tag_t&) override {
    ++blobs_;
  }

  void on_aborted(std::size_t, const blobpipe::event& ev) override {
    problems_.add(describe_abort(ev));
  }

  std::string ok_text() const override {
    return "every sample arrived complete (" + std::to_string(field_count) +
           " keys) and identical to what its worker built";
  }

  std::uint64_t done() const noexcept override { return complete_; }
  std::uint64_t total() const noexcept override { return expected_; }
  const char* unit() const noexcept override { return "samples"; }
  std::uint64_t entries() const noexcept override { return entries_; }
  std::uint64_t bytes() const noexcept override { return bytes_; }
  bool differs() const noexcept override { return differs_; }

  bool report(std::ostream& out) const override {
    problem_log missing;
    for (std::size_t n = 0; n < slots_.size(); ++n) {
      if (!slots_[n].mine || slots_[n].got.all()) continue;
      std::string keys;
      for (std::size_t f = 0; f < field_count; ++f)
        if (!slots_[n].got.test(f)) keys += (keys.empty() ? "" : ", ") + std::string(field_names[f]);
      missing.add("sample " + std::to_string(n) + " incomplete: missing " + keys);
    }
    const auto prompt_tokens = stats_.tokens - stats_.response_tokens;
    out << "trainer: " << complete_ << "/" << expected_ << " samples complete, " << entries_
        << " entries in " << blobs_ << " blobs, " << std::fixed << std::setprecision(2)
        << static_cast<double>(bytes_) / 1e6 << " MB\n"
        << "  tokens " << stats_.tokens << " (prompt " << prompt_tokens << ", response "
        << stats_.response_tokens << "), mean reward " << std::setprecision(3)
        << (stats_.rewards ? stats_.reward_sum / static_cast<double>(stats_.rewards) : 0.0)
        << ", mean response logprob "
        << (stats_.response_tokens
                ? stats_.logprob_sum / static_cast<double>(stats_.response_tokens)
                : 0.0)
        << " nats\n"
        << (mode_ == check_mode::digest
                ? "  checked: each entry's kind, dtype, shape and 64-bit digest (--check digest)\n"
                : "  checked: each entry's kind, dtype, shape and bytes against a rebuilt sample "
                  "(--check full)\n");
    out.unsetf(std::ios::floatfield);
    if (missing.empty() && problems_.empty()) return true;
    out << "FAIL: the batch is incomplete or differs\n";
    problems_.print(out);
    missing.print(out);
    if (other_length_)
      out << "  sample " << other_length_->idx << " arrived with " << other_length_->got
          << " tokens where this side builds " << other_length_->want
          << ": the workers were\n  given another --seq-len than this trainer; give both "
             "sides the same --seq-len\n";
    return false;
  }

 private:
  struct slot {
    std::bitset<field_count> got;
    std::optional<sample> expected;     // check_mode::full
    std::optional<expectation> expect;  // its digests (full: its length only)
    bool mine = true;  // expected here
  };

  static std::string shape_text(const std::vector<std::int64_t>& shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }

  static std::optional<std::string> compare(const received_entry& e, const field& want) {
    const blobpipe::Entry& got = e.entry;
    if (got.kind != want.value.kind) return std::string("kind '") + got.kind + "'";
    if (want.value.kind != blobpipe::KIND_PICKLE) {
      if (got.dtype.value_or("") != want.value.dtype)
        return "dtype " + got.dtype.value_or("nil") + ", expected " + want.value.dtype;
      if (got.shape != want.value.shape)
        return "shape " + shape_text(got.shape.value_or(blobpipe::shape_t{})) + ", expected " + shape_text(want.value.shape);
    }
    if (!std::equal(e.view.bytes.begin(), e.view.bytes.end(), want.bytes.begin(),
                    want.bytes.end()))
      return std::string("bytes differ");
    return std::nullopt;
  }

  // Field f's kind, dtype and shape as sample.hpp makes them (T tokens),
  // then the digest of the bytes that arrived against the builder's.
  static std::optional<std::string> compare_digest(const received_entry& e, std::size_t f,
                                                   const expectation& want) {
    static constexpr const char* dtypes[] = {"int64", "float32", "bool", "float32"};
    const blobpipe::Entry& got = e.entry;
    const auto want_kind = f == 4 ? blobpipe::KIND_PICKLE : blobpipe::KIND_TENSOR;
    if (got.kind != want_kind) return std::string("kind '") + got.kind + "'";
    if (f < 4) {
      if (got.dtype.value_or("") != dtypes[f])
        return "dtype " + got.dtype.value_or("nil") + ", expected " + dtypes[f];
      const blobpipe::shape_t shape =
          f == 3 ? blobpipe::shape_t{} : blobpipe::shape_t{static_cast<std::int64_t>(want.tokens)};
      if (got.shape != shape)
        return "shape " + shape_text(got.shape.value_or(blobpipe::shape_t{})) + ", expected " +
               shape_text(shape);
    }
    if (digest64(e.view.bytes) != want.digest[f])
      return std::string("digest differs (the bytes are not what the worker built)");
    return std::nullopt;
  }

  // A token tensor of another length than this side builds: the sides
  // were given different --seq-len (the first such sample is named).
  void note_length(const received_entry& e, std::int64_t idx, std::size_t want) {
    if (other_length_ || !e.entry.shape || e.entry.shape->size() != 1) return;
    const auto got = static_cast<std::uint64_t>((*e.entry.shape)[0]);
    if (got != want) other_length_ = length_note{idx, got, want};
  }

  // Sums the elements of a little-endian tensor of T (NVDP's byte order)
  // with one bounds-free pass over its bytes; entry_view::at would check,
  // look up the dtype and swap per element, which profiled as the
  // trainer's largest cost.
  // Four partial sums in locals: a member as the accumulator would be
  // stored back on every element, and one chain of dependent additions
  // waits out each add's latency (the profile's hottest loop).
  template <class T, class Acc>
  static void sum_elements(const blobpipe::entry_view& v, Acc& into) {
    Acc acc[4] = {0, 0, 0, 0};
    if constexpr (std::endian::native == std::endian::little) {
      const std::byte* p = v.bytes.data();
      const std::size_t n = v.bytes.size() / sizeof(T);
      std::size_t i = 0;
      for (; i + 4 <= n; i += 4) {
        T x[4];
        std::memcpy(x, p + i * sizeof(T), sizeof x);
        for (int j = 0; j < 4; ++j) acc[j] += x[j];
      }
      for (; i < n; ++i) {
        T x;
        std::memcpy(&x, p + i * sizeof(T), sizeof(T));
        acc[0] += x;
      }
    } else {
      const std::uint64_t n = v.numel();
      for (std::uint64_t i = 0; i < n; ++i) acc[0] += v.at<T>(i);
    }
    into += (acc[0] + acc[1]) + (acc[2] + acc[3]);
  }

  void learn(const received_entry& e, std::size_t field) {
    const blobpipe::entry_view& v = e.view;
    switch (field) {
      case 0:
        stats_.tokens += v.numel();
        break;
      case 1:
        sum_elements<float>(v, stats_.logprob_sum);
        break;
      case 2:
        sum_elements<std::uint8_t>(v, stats_.response_tokens);
        break;
      case 3:
        stats_.reward_sum += v.at<float>(0);
        ++stats_.rewards;
        break;
      default:
        break;  // meta: a pickle the Python side would load
    }
  }

  std::shared_ptr<const sample_builder> builder_;
  std::vector<slot> slots_;
  check_mode mode_;
  std::uint64_t expected_ = 0, complete_ = 0, entries_ = 0, bytes_ = 0, blobs_ = 0;
  batch_stats stats_;
  problem_log problems_;
  bool differs_ = false;
  struct length_note {
    std::int64_t idx;
    std::uint64_t got, want;
  };
  std::optional<length_note> other_length_;
};

}  // namespace

std::unique_ptr<checker> make_batch_check(std::shared_ptr<const sample_builder> builder,
                                          std::size_t batch,
                                          std::function<bool(std::size_t)> mine,
                                          check_mode mode) {
  return std::make_unique<batch_check>(std::move(builder), batch, mine, mode);
}

void problem_log::add(std::string what) {
  if (first_.size() < kept) first_.push_back(std::move(what));
  ++count_;
}

void problem_log::print(std::ostream& out) const {
  for (const auto& p : first_) out << "  " << p << "\n";
  if (count_ > first_.size()) out << "  ... and " << (count_ - first_.size()) << " more\n";
}

}  // namespace rollout
