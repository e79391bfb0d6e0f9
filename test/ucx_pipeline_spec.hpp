// test/ucx_pipeline_spec.hpp — the blobs ucx_pipeline_test's peer process
// streams, built identically in both processes, and the bytes each blob
// must arrive as.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "blobpipe/format.hpp"

namespace blobpipe::testing {

inline constexpr int ucx_blob_count = 6;

struct ucx_blob_spec {
  tag_t tag;
  std::vector<std::string> keys;
  std::vector<std::vector<float>> data;
};

/// Blob i: three entries of 400 bytes (eager), ~80 KB and ~2 MiB
/// (rendezvous on every UCX transport), each value a ramp from i.
inline ucx_blob_spec ucx_blob(int i) {
  ucx_blob_spec s;
  s.tag = make_tag("ucx-2proc-" + std::to_string(i)).value();
  const std::size_t sizes[] = {100, 20000 + std::size_t(i), (512u << 10) + std::size_t(i)};
  for (int e = 0; e < 3; ++e) {
    s.keys.push_back("k" + std::to_string(e));
    std::vector<float> v(sizes[e]);
    for (std::size_t j = 0; j < v.size(); ++j) v[j] = float(i) + float(j);
    s.data.push_back(std::move(v));
  }
  return s;
}

/// The blob `s` as write() lays it out.
inline std::vector<std::byte> ucx_blob_bytes(const ucx_blob_spec& s) {
  std::vector<value> v;
  for (auto& d : s.data) v.push_back(value::tensor(d));
  auto p = plan(s.keys, v, s.tag).value();
  std::vector<std::byte> out(p.nbytes);
  (void)write(p, out).value();
  return out;
}

}  // namespace blobpipe::testing
