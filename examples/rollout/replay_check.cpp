// examples/rollout/replay_check.cpp — the trainer's check of replayed blobs.
//
// Blobs arrive with stream-local ids, in any order across connections, and
// several files may share a tag (NO_TAG) or even an index. So each blob in
// flight keeps the set of files it can still be: those with its tag whose
// entry i has the same row and the same bytes as every entry i seen so far.
// When its tail arrives, the first such file not yet matched, with an
// equal index, is claimed. Every file must be claimed exactly once.
#include <algorithm>
#include <iomanip>
#include <map>

#include "examples/rollout/check.hpp"

namespace rollout {
namespace {

using blobpipe::received_entry;

class replay_check final : public checker {
 public:
  explicit replay_check(std::shared_ptr<const replay_set> set)
      : set_(std::move(set)), claimed_(set_->blobs.size(), false) {}

  void on_entry(std::size_t conn, const received_entry& e) override {
    ++entries_;
    bytes_ += e.entry.len;
    auto& cands = candidates(conn, e.blob_id, e.tag);
    std::erase_if(cands, [&](std::size_t b) {
      const replay_blob& src = set_->blobs[b];
      if (e.index >= src.index.entries.size() || src.index.entries[e.index] != e.entry)
        return true;
      auto want = entry_bytes(src, e.index);
      return !std::equal(e.view.bytes.begin(), e.view.bytes.end(), want.begin(), want.end());
    });
    if (cands.empty())
      problems_.add("blob " + blobpipe::tag_hex(e.tag) + " entry " + std::to_string(e.index) +
                    " " + blobpipe::quote(e.entry.key) + ": no file has this row with these bytes");
  }

  void on_blob(std::size_t conn, const blobpipe::completed_blob& b,
               const blobpipe::tag_t& tag) override {
    auto cands = std::move(candidates(conn, b.blob_id, tag));
    in_flight_.erase({conn, b.blob_id});
    auto it = std::find_if(cands.begin(), cands.end(), [&](std::size_t i) {
      return !claimed_[i] && set_->blobs[i].index.entries == b.index.entries;
    });
    if (it == cands.end()) {
      problems_.add("blob " + blobpipe::tag_hex(tag) + " (" +
                    std::to_string(b.index.entries.size()) +
                    " entries) matches no file not already received");
      return;
    }
    claimed_[*it] = true;
    ++matched_;
  }

  void on_aborted(std::size_t conn, const blobpipe::event& ev) override {
    in_flight_.erase({conn, ev.blob_id});
    problems_.add(describe_abort(ev));
  }

  std::string ok_text() const override {
    return "replayed " + std::to_string(matched_) +
           " blobs; every entry is byte-identical to its file";
  }

  std::uint64_t done() const noexcept override { return matched_; }
  std::uint64_t total() const noexcept override { return set_->blobs.size(); }
  const char* unit() const noexcept override { return "blobs"; }
  std::uint64_t entries() const noexcept override { return entries_; }
  std::uint64_t bytes() const noexcept override { return bytes_; }

  bool report(std::ostream& out) const override {
    problem_log missing;
    for (std::size_t i = 0; i < claimed_.size(); ++i)
      if (!claimed_[i]) missing.add(set_->blobs[i].name + ": never arrived whole");
    out << "trainer: " << matched_ << "/" << set_->blobs.size() << " blobs matched, " << entries_
        << " entries, " << std::fixed << std::setprecision(2)
        << static_cast<double>(bytes_) / 1e6 << " MB\n";
    out.unsetf(std::ios::floatfield);
    if (missing.empty() && problems_.empty()) return true;
    out << "FAIL: replayed blobs are missing or differ\n";
    problems_.print(out);
    missing.print(out);
    return false;
  }

 private:
  // Files a blob in flight can still be; all files with its tag at first.
  std::vector<std::size_t>& candidates(std::size_t conn, std::uint64_t blob_id,
                                       const blobpipe::tag_t& tag) {
    auto [it, inserted] = in_flight_.try_emplace({conn, blob_id});
    if (inserted) {
      for (std::size_t i = 0; i < set_->blobs.size(); ++i)
        if (set_->blobs[i].index.foot.tag == tag) it->second.push_back(i);
    }
    return it->second;
  }

  std::shared_ptr<const replay_set> set_;
  std::vector<bool> claimed_;
  std::map<std::pair<std::size_t, std::uint64_t>, std::vector<std::size_t>> in_flight_;
  std::uint64_t matched_ = 0, entries_ = 0, bytes_ = 0;
  problem_log problems_;
};

}  // namespace

std::unique_ptr<checker> make_replay_check(std::shared_ptr<const replay_set> set) {
  return std::make_unique<replay_check>(std::move(set));
}

}  // namespace rollout
