// The consumer's device uploads (device_uploads in consumer_state.hpp;
// consumer_options::landing, docs/cuda.md): an entry whose home is device
// memory, landed on the host, is copied there (device_lander) before it
// is yielded.
#include "lib/pipeline/consumer_state.hpp"
#include "lib/pipeline/entry_lease.hpp"

namespace blobpipe::detail {

asio::awaitable<result<void>> device_uploads::upload(ready_event& r, consumer_stats& stats) {
  received_entry& e = *r.upload;
  auto done = co_await lander->upload(e.view.bytes, r.device, r.device->data());
  if (!done) co_return done;
  ++stats.device_entries;
  stats.device_chunks = lander->chunks();
  e.memory = memory_kind::cuda_device;
  e.device = cuda::device_view{&e.entry, r.device->data(), e.entry.len, lander->device(),
                               e.view.type, e.view.shape};
  e.view.bytes = {};  // device memory: not for the CPU
  // The host copy has served: its buffer goes back to the pool now.
  lease_of(e.storage).own.reset();
  r.upload.reset();
  co_return done;
}

}  // namespace blobpipe::detail
