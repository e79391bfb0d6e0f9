// tools/layout_check.cpp — see layout_check.hpp.
#include "tools/layout_check.hpp"

#include <algorithm>

namespace blobpipe::cli {
namespace {

std::string describe(const blob_index& idx, std::size_t i) {
  const Entry& e = idx.entries[i];
  return "entry " + std::to_string(i) + " " + quote(e.key) + " [" + std::to_string(e.off) +
         ", +" + std::to_string(e.len) + ")";
}

// Entries (in index order) that start before the one before them.
void check_order(const blob_index& idx, std::vector<finding>& out) {
  finding f{"entries_out_of_order", errc::entry_out_of_range, 0, {}};
  for (std::size_t i = 1; i < idx.entries.size(); ++i) {
    if (idx.entries[i].off >= idx.entries[i - 1].off) continue;
    if (f.count++ == 0)
      f.message = describe(idx, i) + " starts before " + describe(idx, i - 1) +
                  "; the reference writes entries in order";
  }
  if (f.count) out.push_back(std::move(f));
}

// Non-empty entries whose bytes intersect another's, whatever their order.
void check_overlap(const blob_index& idx, std::vector<finding>& out) {
  struct span_of {
    std::uint64_t off, end;
  };
  std::vector<std::pair<span_of, std::size_t>> spans;  // (range, index row)
  for (std::size_t i = 0; i < idx.entries.size(); ++i) {
    const Entry& e = idx.entries[i];
    if (e.len > 0) spans.push_back({{e.off, e.off + e.len}, i});  // parse_index: no overflow
  }
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return a.first.off != b.first.off ? a.first.off < b.first.off : a.second < b.second;
  });
  finding f{"entries_overlap", errc::entry_out_of_range, 0, {}};
  std::size_t reach = 0;  // the entry ending furthest so far
  for (std::size_t k = 1; k < spans.size(); ++k) {
    if (spans[k].first.off < spans[reach].first.end) {
      if (f.count++ == 0)
        f.message = describe(idx, spans[k].second) + " overlaps " +
                    describe(idx, spans[reach].second);
    }
    if (spans[k].first.end > spans[reach].first.end) reach = k;
  }
  if (f.count) out.push_back(std::move(f));
}

}  // namespace

std::vector<finding> check_layout(const blob_index& idx) {
  std::vector<finding> out;
  const std::uint64_t index_end = std::uint64_t{idx.foot.index_off} + idx.foot.index_len;
  const std::uint64_t footer_at = idx.nbytes - idx.foot.size();
  if (index_end < footer_at) {
    const std::uint64_t n = footer_at - index_end;
    out.push_back({"bytes_after_index", errc::index_out_of_range, n,
                   std::to_string(n) + " bytes between the index (ends at " +
                       std::to_string(index_end) + ") and the footer (at " +
                       std::to_string(footer_at) + "); the reference writes none"});
  }
  check_order(idx, out);
  check_overlap(idx, out);
  return out;
}

}  // namespace blobpipe::cli
