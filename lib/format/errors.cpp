#include "blobpipe/errors.hpp"

namespace blobpipe {
namespace {

class blobpipe_category final : public std::error_category {
 public:
  const char* name() const noexcept override { return "blobpipe"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
      case errc::too_small: return "blob too small for a footer";
      case errc::bad_footer: return "bad blob magic or unsupported blob version";
      case errc::index_out_of_range: return "index range outside the blob";
      case errc::malformed_index: return "malformed index";
      case errc::entry_out_of_range: return "entry range outside the data region";
      case errc::shape_mismatch: return "shape x itemsize does not match entry length";
      case errc::unknown_kind: return "unknown entry kind";
      case errc::unknown_dtype: return "unknown dtype";
      case errc::too_large: return "blob too large for a v3 footer";
      case errc::buffer_too_small: return "output buffer too small";
      case errc::invalid_argument: return "invalid argument";
      case errc::closed: return "closed";
      case errc::peer_closed: return "peer closed the connection";
      case errc::peer_failed: return "peer failed";
      case errc::protocol_violation: return "protocol violation";
      case errc::timed_out: return "timed out";
      case errc::aborted: return "blob aborted by its producer";
      case errc::cuda_failure: return "CUDA call failed";
      case errc::io: return "file I/O failed";
    }
    return "unknown blobpipe error";
  }
};

}  // namespace

const std::error_category& category() noexcept {
  static const blobpipe_category c;
  return c;
}

const char* errc_name(errc e) noexcept {
  switch (e) {
    case errc::too_small: return "too_small";
    case errc::bad_footer: return "bad_footer";
    case errc::index_out_of_range: return "index_out_of_range";
    case errc::malformed_index: return "malformed_index";
    case errc::entry_out_of_range: return "entry_out_of_range";
    case errc::shape_mismatch: return "shape_mismatch";
    case errc::unknown_kind: return "unknown_kind";
    case errc::unknown_dtype: return "unknown_dtype";
    case errc::too_large: return "too_large";
    case errc::buffer_too_small: return "buffer_too_small";
    case errc::invalid_argument: return "invalid_argument";
    case errc::closed: return "closed";
    case errc::peer_closed: return "peer_closed";
    case errc::peer_failed: return "peer_failed";
    case errc::protocol_violation: return "protocol_violation";
    case errc::timed_out: return "timed_out";
    case errc::aborted: return "aborted";
    case errc::cuda_failure: return "cuda_failure";
    case errc::io: return "io";
  }
  return "unknown";
}

const char* errc_name(std::error_code ec) noexcept {
  if (ec.category() != category()) return "unknown";
  return errc_name(static_cast<errc>(ec.value()));
}

}  // namespace blobpipe
