// Sorting what UCX's non-blocking calls return.
//
// Every *_nbx call returns a ucs_status_ptr_t that is one of three things:
// NULL (done at once), an error encoded in the pointer (UCS_PTR_IS_ERR), or
// a request that completes later through its callback and must then be
// freed (ucp_request_free). One helper sorts them, so no caller decodes the
// pointer itself.
//
//   auto s = sort_status(ucp_ep_flush_nbx(ep, &param));
//   if (s.what == status_kind::pending) wait for s.request;
//
// Source: UCX examples/ucp_util.h (ucx_wait, ep_close).
#pragma once

#include <string>

#include <ucp/api/ucp.h>

namespace blobpipe::ucx::detail {

enum class status_kind { done, failed, pending };

struct sorted_status {
  status_kind what;
  ucs_status_t status;      ///< UCS_OK, the error, or UCS_INPROGRESS
  void* request = nullptr;  ///< only when pending
};

/// Sorts a status pointer: NULL -> done, UCS_PTR_IS_ERR -> failed with the
/// error, otherwise pending with the request.
inline sorted_status sort_status(ucs_status_ptr_t p) noexcept {
  if (p == nullptr) return {status_kind::done, UCS_OK};
  if (UCS_PTR_IS_ERR(p)) return {status_kind::failed, UCS_PTR_STATUS(p)};
  return {status_kind::pending, UCS_INPROGRESS, p};
}

/// "what: <UCX status string>" for last_error() and result messages.
inline std::string status_message(const char* what, ucs_status_t st) {
  return std::string(what) + ": " + ucs_status_string(st);
}

}  // namespace blobpipe::ucx::detail
