#include "lib/transport/ucx/pairing.hpp"

#include <algorithm>
#include <vector>

#include "lib/transport/ucx/handles.hpp"
#include "lib/transport/ucx/status.hpp"

namespace blobpipe::ucx::detail {
namespace {

// Zeros after a peer's address. UCX 1.13's unpacker reads fields of at
// most 255 bytes each, a bounded number of them per transport and at most
// 64 transports; zeros end a device's list, so a parse that reaches them
// stops within a few KiB.
constexpr std::size_t address_padding = std::size_t{64} << 10;

}  // namespace

bool pairing::same_format(std::span<const std::byte> remote) const noexcept {
  constexpr auto version_bits = std::byte{0x0f};
  return !remote.empty() && !own_.empty() &&
         (remote[0] & version_bits) == (own_[0] & version_bits);
}

std::uint32_t pairing::next(std::span<const std::byte> remote) const {
  auto it = next_.find(key(remote));
  return it == next_.end() ? 0 : it->second;
}

void pairing::skip_to(std::span<const std::byte> remote, std::uint32_t sn) {
  while (next(remote) < sn) {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // as the endpoint it may meet
    auto ep = create(remote, p);
    if (!ep && next(remote) > last_sn) return;  // counted out (not reached: sn <= last_sn)
    if (ep) {
      endpoint discard(*ep);  // force-closed as it goes
    }
  }
}

result<ucp_ep_h> pairing::create(std::span<const std::byte> remote, ucp_ep_params_t p) {
  std::uint32_t& n = next_[key(remote)];
  if (n > last_sn)
    return {errc::peer_failed,
            "ucx: 65535 endpoints to this peer's worker already; UCX 1.13 pairs no more "
            "(docs/ucx.md \"Gaps\")"};
  std::vector<std::byte> padded(remote.size() + address_padding);
  std::copy(remote.begin(), remote.end(), padded.begin());
  p.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_FLAGS;
  p.address = reinterpret_cast<const ucp_address_t*>(padded.data());
  p.flags |= UCP_EP_PARAMS_FLAGS_NO_LOOPBACK;
  ucp_ep_h ep = nullptr;
  const ucs_status_t st = ucp_ep_create(worker_, &p, &ep);
  ++n;
  if (st != UCS_OK) return {errc::peer_failed, status_message("ucx: ucp_ep_create", st)};
  return ep;
}

}  // namespace blobpipe::ucx::detail
