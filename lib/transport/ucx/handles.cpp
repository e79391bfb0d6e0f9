#include "lib/transport/ucx/handles.hpp"

#include <algorithm>
#include <cstdlib>
#include <initializer_list>

#include "lib/transport/ucx/status.hpp"

namespace blobpipe::ucx::detail {

namespace {

// blobpipe's UCX defaults. Each applies unless one of its environment
// variables is set or the caller's overrides name it. `name` is what
// ucp_config_modify resolves for the setting in UCX 1.13
// (UCX_POSIX_ERROR_HANDLING is not one); `env` lists only variables UCX
// itself reads for it (UCX_MM_ERROR_HANDLING reaches posix and sysv,
// UCX_MEMORY_INVALIDATE reaches nothing: UCX warns it is unused, so it
// must not switch blobpipe's default off).
//
// Peer error handling: every blobpipe endpoint runs in
// UCP_ERR_HANDLING_MODE_PEER, and UCX 1.13 leaves a transport out of such
// an endpoint unless it can report peer failures: posix and sysv only
// with their error handling on, cma (for rendezvous reads) only with
// memory invalidation on. Without these the shared-memory transports in
// UCX_TLS are silently unused.
struct ucx_default {
  const char* name;
  const char* value;
  std::initializer_list<const char*> env;  // settings that already say it
  std::initializer_list<const char*> tls;  // UCX_TLS entries that need it; empty: always
};
const ucx_default ucx_defaults[] = {
    {"MM_ERROR_HANDLING",
     "y",
     {"UCX_MM_ERROR_HANDLING", "UCX_POSIX_ERROR_HANDLING", "UCX_SYSV_ERROR_HANDLING"},
     {"all", "sm", "shm", "mm", "posix", "sysv"}},
    {"MEMORY_INVALIDATE",
     "y",
     {"UCX_CMA_MEMORY_INVALIDATE"},
     {"all", "sm", "shm", "cma"}},
};

// Whether the transport list (UCX_TLS syntax: comma separated, "^" to
// exclude, "\\" suffixes allowed) may select a transport named in `names`.
bool may_use(const std::string& tls, std::initializer_list<const char*> names) {
  if (tls.empty() || tls[0] == '^') return true;  // all, or all but some
  std::size_t pos = 0;
  while (pos <= tls.size()) {
    std::size_t end = tls.find(',', pos);
    if (end == std::string::npos) end = tls.size();
    std::string entry = tls.substr(pos, end - pos);
    if (auto bs = entry.find('\\'); bs != std::string::npos) entry.resize(bs);
    for (const char* n : names)
      if (entry == n) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> effective_config(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  auto named = [&](const char* name) {
    return std::any_of(overrides.begin(), overrides.end(),
                       [&](const auto& o) { return o.first == name; });
  };
  std::string tls = "all";
  if (const char* env = std::getenv("UCX_TLS")) tls = env;
  for (const auto& o : overrides)
    if (o.first == "TLS") tls = o.second;
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& d : ucx_defaults) {
    bool in_env = std::any_of(d.env.begin(), d.env.end(),
                              [](const char* e) { return std::getenv(e) != nullptr; });
    // Only where it matters: UCX warns about settings no transport used.
    if (!named(d.name) && !in_env && (d.tls.size() == 0 || may_use(tls, d.tls)))
      out.emplace_back(d.name, d.value);
  }
  out.insert(out.end(), overrides.begin(), overrides.end());
  return out;
}

result<context> context::create(const std::vector<std::pair<std::string, std::string>>& overrides) {
  ucp_config_t* cfg = nullptr;
  if (auto st = ucp_config_read(nullptr, nullptr, &cfg); st != UCS_OK)
    return {errc::peer_failed, status_message("ucp_config_read", st)};
  for (const auto& [name, value] : effective_config(overrides)) {
    if (auto st = ucp_config_modify(cfg, name.c_str(), value.c_str()); st != UCS_OK) {
      ucp_config_release(cfg);
      return {errc::invalid_argument,
              status_message(("ucp_config_modify UCX_" + name + "=" + value).c_str(), st)};
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  // AM carries the frames; WAKEUP gives the worker an event fd to sleep on.
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "blobpipe";
  ucp_context_h h = nullptr;
  auto st = ucp_init(&params, cfg, &h);
  ucp_config_release(cfg);
  if (st != UCS_OK) return {errc::peer_failed, status_message("ucp_init", st)};
  return context(h);
}

context& context::operator=(context&& o) noexcept {
  if (this != &o) {
    if (h_) ucp_cleanup(h_);
    h_ = std::exchange(o.h_, nullptr);
  }
  return *this;
}

context::~context() {
  if (h_) ucp_cleanup(h_);
}

result<worker> worker::create(const context& ctx) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h h = nullptr;
  if (auto st = ucp_worker_create(ctx.get(), &params, &h); st != UCS_OK)
    return {errc::peer_failed, status_message("ucp_worker_create", st)};
  return worker(h);
}

worker& worker::operator=(worker&& o) noexcept {
  if (this != &o) {
    if (h_) ucp_worker_destroy(h_);
    h_ = std::exchange(o.h_, nullptr);
  }
  return *this;
}

worker::~worker() {
  if (h_) ucp_worker_destroy(h_);
}

result<int> worker::event_fd() const {
  int fd = -1;
  if (auto st = ucp_worker_get_efd(h_, &fd); st != UCS_OK)
    return {errc::peer_failed, status_message("ucp_worker_get_efd", st)};
  return fd;
}

result<std::vector<std::byte>> worker::address() const {
  ucp_address_t* a = nullptr;
  std::size_t n = 0;
  if (auto st = ucp_worker_get_address(h_, &a, &n); st != UCS_OK)
    return {errc::peer_failed, status_message("ucp_worker_get_address", st)};
  const auto* p = reinterpret_cast<const std::byte*>(a);
  std::vector<std::byte> out(p, p + n);
  ucp_worker_release_address(h_, a);
  return out;
}

namespace {
void force_close(ucp_ep_h ep) noexcept {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  auto s = sort_status(ucp_ep_close_nbx(ep, &p));
  if (s.what == status_kind::pending) ucp_request_free(s.request);
}
}  // namespace

endpoint& endpoint::operator=(endpoint&& o) noexcept {
  if (this != &o) {
    if (h_) force_close(h_);
    h_ = std::exchange(o.h_, nullptr);
  }
  return *this;
}

endpoint::~endpoint() {
  if (h_) force_close(h_);
}

}  // namespace blobpipe::ucx::detail
