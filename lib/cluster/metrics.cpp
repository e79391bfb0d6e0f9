// Counters and the latency histogram (blobpipe/cluster/metrics.hpp).
#include "blobpipe/cluster/metrics.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>

namespace blobpipe {

std::size_t latency_histogram::bucket_of(std::uint64_t ns) noexcept {
  constexpr std::uint64_t linear = 1u << sub_bits;
  if (ns < linear) return static_cast<std::size_t>(ns);
  const int e = 63 - std::countl_zero(ns);  // >= sub_bits
  const std::uint64_t sub = (ns >> (e - sub_bits)) & (linear - 1);
  return (static_cast<std::size_t>(e - sub_bits + 1) << sub_bits) + sub;
}

std::uint64_t latency_histogram::bucket_low(std::size_t b) noexcept {
  constexpr std::uint64_t linear = 1u << sub_bits;
  if (b < linear) return b;
  const int e = static_cast<int>(b >> sub_bits) + sub_bits - 1;
  return (linear + (b & (linear - 1))) << (e - sub_bits);
}

void latency_histogram::record(std::uint64_t ns) noexcept {
  ++counts_[bucket_of(ns)];
  ++count_;
  max_ = std::max(max_, ns);
}

void latency_histogram::merge(const latency_histogram& o) noexcept {
  for (std::size_t i = 0; i < buckets; ++i) counts_[i] += o.counts_[i];
  count_ += o.count_;
  max_ = std::max(max_, o.max_);
}

std::uint64_t latency_histogram::percentile(double q) const noexcept {
  if (count_ == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  // The rank of the quantile, 1-based: the smallest value with at least
  // q of the samples at or below it.
  auto rank = static_cast<std::uint64_t>(q * static_cast<double>(count_) + 0.5);
  rank = std::clamp<std::uint64_t>(rank, 1, count_);
  std::uint64_t seen = 0;
  for (std::size_t b = 0; b < buckets; ++b) {
    seen += counts_[b];
    if (seen < rank) continue;
    const std::uint64_t low = bucket_low(b);
    const std::uint64_t high = b + 1 < buckets ? bucket_low(b + 1) : low;
    return std::min(low + (high - low) / 2, max_);
  }
  return max_;
}

void endpoint_metrics::merge(const endpoint_metrics& o) noexcept {
  bytes += o.bytes;
  entries += o.entries;
  blobs += o.blobs;
  aborts += o.aborts;
  credit_waits += o.credit_waits;
  reconnects += o.reconnects;
  latency.merge(o.latency);
  if (o.first_entry_s && (!first_entry_s || *o.first_entry_s < *first_entry_s))
    first_entry_s = o.first_entry_s;
}

namespace {

std::string ms(std::uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1e6);
  return buf;
}

}  // namespace

std::string to_json(const endpoint_metrics& m) {
  const auto n = [](std::uint64_t v) { return std::to_string(v); };
  std::string out = "{\"bytes\":" + n(m.bytes) + ",\"entries\":" + n(m.entries) +
                    ",\"blobs\":" + n(m.blobs) + ",\"aborts\":" + n(m.aborts) +
                    ",\"credit_waits\":" + n(m.credit_waits) + ",\"reconnects\":" +
                    n(m.reconnects) + ",\"latency_ms\":{\"count\":" + n(m.latency.count()) +
                    ",\"p50\":" + ms(m.latency.percentile(0.5)) + ",\"p90\":" +
                    ms(m.latency.percentile(0.9)) + ",\"p99\":" + ms(m.latency.percentile(0.99)) +
                    ",\"max\":" + ms(m.latency.max()) + "},\"first_entry_s\":";
  if (m.first_entry_s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6f", *m.first_entry_s);
    out += buf;
  } else {
    out += "null";
  }
  return out + "}";
}

endpoint_metrics metrics_of(const sender_stats& st, std::uint64_t since_ns) noexcept {
  endpoint_metrics m;
  m.bytes = st.bytes_sent;
  m.entries = st.entries_sent;
  m.blobs = st.blobs_sent;
  m.aborts = st.blobs_aborted;
  m.credit_waits = st.credit_waits;
  m.reconnects = st.reconnects;
  if (since_ns != 0 && st.first_entry_ns >= since_ns)
    m.first_entry_s = static_cast<double>(st.first_entry_ns - since_ns) / 1e9;
  return m;
}

std::string to_json(const sender_stats& st, std::uint64_t since_ns) {
  const auto n = [](std::uint64_t v) { return std::to_string(v); };
  return "{\"role\":\"sender\",\"total\":" + to_json(metrics_of(st, since_ns)) +
         ",\"credit_requests\":" + n(st.credit_requests) + ",\"blobs_resent\":" +
         n(st.blobs_resent) + ",\"blobs_delivered\":" + n(st.blobs_delivered) +
         ",\"budget_waits\":" + n(st.budget_waits) + "}";
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace blobpipe
