#include "lib/transport/ucx/runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cstdlib>

#include <asio/execution_context.hpp>
#include <asio/post.hpp>

#include "lib/runtime/deadline.hpp"
#include "lib/transport/ucx/connection.hpp"
#include "lib/transport/ucx/devices.hpp"
#include "lib/transport/ucx/status.hpp"

namespace blobpipe::ucx::detail {
namespace {

// Finds the runtime of an execution context. It only points at the runtime
// (transports own it) and breaks its keep-alive cycles at shutdown.
class registry : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;
  explicit registry(asio::execution_context& ctx) : asio::execution_context::service(ctx) {}
  std::weak_ptr<runtime> current;

 private:
  void shutdown() override {
    if (auto rt = current.lock()) rt->shutdown();
  }
};

template <unsigned Id>
ucs_status_t am_callback(void* arg, const void* header, std::size_t header_length, void* data,
                         std::size_t length, const ucp_am_recv_param_t* param);

}  // namespace

result<std::shared_ptr<runtime>> runtime::of(const asio::any_io_executor& ex, const options& opt,
                                             std::optional<asio::ip::address_v4> listening_on) {
  const config_list& config = opt.config;
  auto& reg = asio::use_service<registry>(asio::query(ex, asio::execution::context));
  if (auto rt = reg.current.lock()) {
    if (!config.empty() && config != rt->config_)
      return {errc::invalid_argument,
              "ucx: this io_context's UCX context was created with other config overrides"};
    if (listening_on && !rt->tcp_interface_.empty()) {
      // UCX's tcp listens on that interface only: a peer that reached this
      // listener through another could not reach UCX's tcp.
      const std::string iface =
          listening_on->is_unspecified() ? std::string() : interface_of(*listening_on);
      if (iface != rt->tcp_interface_)
        return {errc::invalid_argument,
                "ucx listen on " + listening_on->to_string() +
                    (iface.empty() ? std::string() : " (" + iface + ")") +
                    ": this io_context's UCX tcp transport is confined to " +
                    rt->tcp_interface_ +
                    ", where its first listen was (options::tcp_on_listen_interface_only); "
                    "listen on another io_context, or create this one's UCX context with "
                    "that option false or with UCX_NET_DEVICES set"};
    }
    return rt;
  }
  // Confine UCX's tcp transport (its own listening ports: docs/ucx.md
  // "Foreign bytes") to the listener's interface, unless the user chose
  // the devices (the environment, even "all"; options::config; a ucx.conf
  // UCX reads, where only a value other than UCX's default "all" can
  // tell) or opted out.
  config_list create_config = config;
  std::string tcp_interface;
  bool loopback_only = false;
  const auto user_chose_devices = [&] {
    if (std::getenv("UCX_NET_DEVICES") != nullptr ||
        std::any_of(config.begin(), config.end(),
                    [](const auto& c) { return c.first == "NET_DEVICES"; }))
      return true;
    const std::string configured = configured_net_devices();
    return !configured.empty() && configured != "all";
  };
  if (listening_on && !listening_on->is_unspecified() && opt.tcp_on_listen_interface_only &&
      !user_chose_devices()) {
    if (std::string iface = interface_of(*listening_on); !iface.empty()) {
      if (std::string value = net_devices_confining_tcp(tl_devices(), iface); !value.empty()) {
        // The loopback interface alone: no network device reaches another host.
        loopback_only = listening_on->is_loopback() && value == iface;
        create_config.emplace_back("NET_DEVICES", std::move(value));
        tcp_interface = std::move(iface);
      }
    }
  }
  auto ctx = context::create(create_config);
  if (!ctx) return ctx.err();
  auto w = worker::create(*ctx);
  if (!w) return w.err();
  auto fd = w->event_fd();
  if (!fd) return fd.err();
  auto address = w->address();
  if (!address) return address.err();
  // The descriptor closes what it holds; the worker owns the original fd.
  int copy = ::dup(*fd);
  if (copy < 0) return {errc::peer_failed, "ucx: dup of the worker event fd failed"};
  auto rt = std::make_shared<runtime>(passkey{}, ex, std::move(*ctx), std::move(*w), copy, config,
                                      opt.busy_poll, std::move(*address), std::move(tcp_interface),
                                      loopback_only);
  for (unsigned id : {am_message, am_goodbye, am_goodbye_ack, am_verify}) {
    if (auto st = rt->set_am_handler(id); st != UCS_OK)
      return {errc::peer_failed, status_message("ucp_worker_set_am_recv_handler", st)};
  }
  rt->kick();  // the first pass arms the worker and waits on its event fd
  reg.current = rt;
  return rt;
}

runtime::runtime(passkey, asio::any_io_executor ex, detail::context ctx, detail::worker w,
                 int efd_copy, config_list config, std::chrono::microseconds busy_poll,
                 std::vector<std::byte> address, std::string tcp_interface, bool loopback_only)
    : ex_(std::move(ex)),
      context_(std::move(ctx)),
      worker_(std::move(w)),
      efd_(ex_, efd_copy),
      config_(std::move(config)),
      tcp_interface_(std::move(tcp_interface)),
      loopback_only_(loopback_only),
      address_(std::move(address)),
      pairs_(worker_.get(), address_),
      pairing_lock_(ex_),
      busy_poll_(busy_poll) {}

runtime::~runtime() {
  // Owners close their connections first, so this is only a safety net.
  shutdown();
  // Let UCX finish what it completes by itself (requests freed early, such
  // as goodbyes, and the purges of force-closed endpoints) so that the
  // worker is destroyed with its request pool empty. Callbacks that run
  // here only post to the executor, where nothing of this runtime is left.
  for (int i = 0; i < 1000 && ucp_worker_progress(worker_.get()) != 0; ++i) {
  }
}

bool runtime::cuda_memory() const noexcept {
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_.get(), &attr) != UCS_OK) return false;
  return (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
}

ucs_status_t runtime::set_am_handler(unsigned id) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = id;
  // WHOLE_MSG: one callback per message. PERSISTENT_DATA: eager data may be
  // kept (UCS_INPROGRESS) until read_some/read_exact copy it out, instead of
  // being copied into a buffer of ours first.
  p.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
  p.cb = id == am_message       ? &am_callback<am_message>
         : id == am_goodbye     ? &am_callback<am_goodbye>
         : id == am_goodbye_ack ? &am_callback<am_goodbye_ack>
                                : &am_callback<am_verify>;
  p.arg = this;
  return ucp_worker_set_am_recv_handler(worker_.get(), &p);
}

namespace {

template <unsigned Id>
ucs_status_t am_callback(void* arg, const void* header, std::size_t header_length, void* data,
                         std::size_t length, const ucp_am_recv_param_t* param) {
  auto* rt = static_cast<runtime*>(arg);
  ucp_ep_h ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : nullptr;
  bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if constexpr (Id == am_verify) {
    // Routed by its nonce, not its endpoint: it tells whether the
    // endpoints paired at all.
    rt->on_verify(ep, std::span(static_cast<const std::byte*>(header), header_length));
    return rndv ? UCS_ERR_CANCELED : UCS_OK;
  }
  connection* c = ep ? rt->find(ep) : nullptr;
  if (c == nullptr) {
    // Nobody listens on this endpoint any more (closed): a rendezvous
    // sender learns it from the status, eager data is dropped.
    return rndv ? UCS_ERR_CANCELED : UCS_OK;
  }
  if constexpr (Id == am_message) {
    return c->on_message(std::span(static_cast<const std::byte*>(header), header_length), data,
                       length, param->recv_attr);
  } else if constexpr (Id == am_goodbye) {
    c->on_goodbye();
  } else {
    c->on_goodbye_ack();
  }
  return rndv ? UCS_ERR_CANCELED : UCS_OK;
}

}  // namespace

void runtime::wait_fd() {
  fd_waiting_ = true;
  // Only a weak reference: the runtime ends with its last owner, and the
  // descriptor's destruction then completes this wait with an error.
  efd_.async_wait(asio::posix::stream_descriptor::wait_read,
                  [weak = weak_from_this()](std::error_code) {
                    auto rt = weak.lock();
                    if (!rt) return;
                    rt->fd_waiting_ = false;
                    rt->progress_pass();
                  });
}

void runtime::retire(std::shared_ptr<const void> owner) {
  if (!owner) return;
  retired_.emplace_back(std::chrono::steady_clock::now() + retire_linger, std::move(owner));
}

void runtime::progress_pass() {
  assert(!in_progress_ && "ucp_worker_progress must not be re-entered");
  // Retired memory whose linger is over goes now, all of it (kept in
  // retire order, so the front expires first).
  const auto start = std::chrono::steady_clock::now();
  while (!retired_.empty() && retired_.front().first < start) retired_.pop_front();
  in_progress_ = true;
  unsigned events = 0;
  bool poll_on = false;
  bool armed = false;
  for (;;) {
    while (unsigned n = ucp_worker_progress(worker_.get())) events += n;
    const auto now = std::chrono::steady_clock::now();
    // A pass that found work woke coroutines that will likely start more
    // (the next send, the next fetch): come back once they ran instead of
    // arming. Keep coming back for busy_poll after the last event, so a
    // busy connection is not put to sleep and signalled awake between
    // messages; after that, arm and sleep.
    if (events > 0) last_events_ = now;
    if (events > 0 || now - last_events_ < busy_poll_) {
      poll_on = true;
      break;
    }
    // UCS_ERR_BUSY: events arrived since the last progress; sleeping now
    // could miss them. Progress again, but from the executor's queue: UCX
    // 1.13 can answer BUSY over and over with nothing to progress (seen
    // after a peer was killed mid-stream), and looping here would starve
    // every other handler (timers, signals, the rendezvous sockets that
    // tell the peer is gone).
    const ucs_status_t st = ucp_worker_arm(worker_.get());
    if (st == UCS_ERR_BUSY) {
      busy_without_events_ = events == 0 ? busy_without_events_ + 1 : 0;
      poll_on = true;
      break;
    }
    busy_without_events_ = 0;
    armed = st == UCS_OK;
    break;
  }
  in_progress_ = false;
  if (busy_without_events_ > busy_passes_before_backoff) {
    // Still BUSY with nothing to do: look again in a while, not at once.
    backoff_.emplace(ex_, busy_backoff, [weak = weak_from_this()] {
      if (auto rt = weak.lock()) rt->progress_pass();
    });
    return;
  }
  // Wait on the event fd only once the worker is armed. While it is not,
  // UCX leaves its own descriptors ready, so the fd would read as ready
  // again at once: a loop of epoll calls (most of a busy sender's time
  // before this) that the polling passes make needless.
  // (Should arming fail, keep polling rather than sleep unwoken.)
  if (poll_on || !armed)
    kick();
  else if (!fd_waiting_)
    wait_fd();
}

void runtime::hold_for(std::chrono::milliseconds d) {
  blobpipe::detail::keep_alive_for(ex_, d, shared_from_this());
}

void runtime::kick() {
  if (kick_posted_) return;
  kick_posted_ = true;
  asio::post(ex_, [weak = weak_from_this()] {
    if (auto rt = weak.lock()) {
      rt->kick_posted_ = false;
      rt->progress_pass();
    }
  });
}

void runtime::attach(ucp_ep_h ep, connection* c) { eps_[ep] = c; }

void runtime::detach(ucp_ep_h ep, const connection* c) noexcept {
  auto it = eps_.find(ep);
  if (it != eps_.end() && it->second == c) eps_.erase(it);
}

connection* runtime::find(ucp_ep_h ep) const noexcept {
  auto it = eps_.find(ep);
  return it == eps_.end() ? nullptr : it->second;
}

void runtime::retain(std::shared_ptr<connection> c) {
  const connection* key = c.get();
  closing_.emplace(key, std::move(c));
}

void runtime::release(const connection* c) noexcept {
  auto it = closing_.find(c);
  if (it == closing_.end()) return;
  // Move out first: destroying the connection may drop the last owner of
  // this runtime, which must not happen inside erase().
  auto keep = std::move(it->second);
  closing_.erase(it);
  keep.reset();
}

std::uint64_t runtime::park(std::shared_ptr<connection> c) {
  const std::uint64_t key = next_park_key_++;
  parked_.emplace(key, std::move(c));
  return key;
}

std::shared_ptr<connection> runtime::take(std::uint64_t key) noexcept {
  auto it = parked_.find(key);
  if (it == parked_.end()) return nullptr;
  auto c = std::move(it->second);
  parked_.erase(it);
  return c;
}

void runtime::expect_verify(const nonce& n, connection* c) { verifying_[n] = c; }

void runtime::forget_verify(const nonce& n) noexcept { verifying_.erase(n); }

void runtime::on_verify(ucp_ep_h reply_ep, std::span<const std::byte> header) noexcept {
  if (header.size() != nonce_bytes) return;  // not from a blobpipe rendezvous
  nonce n;
  std::copy(header.begin(), header.end(), n.begin());
  auto it = verifying_.find(n);
  if (it == verifying_.end()) return;  // given up on already
  it->second->on_verify(reply_ep);
}

void runtime::shutdown() noexcept {
  auto self = weak_from_this().lock();  // null inside the destructor
  std::vector<std::shared_ptr<connection>> all;
  for (auto& [key, c] : closing_) all.push_back(c);
  for (auto& [ep, c] : eps_)
    if (!closing_.count(c)) all.push_back(c->shared_from_this());
  if (all.empty()) return;
  // No more handlers will run: close what is open by force, and let UCX
  // finish the closes it can (bounded), so the worker is destroyed with
  // no requests outstanding. Callbacks still only record and post.
  for (auto& c : all) c->force_close();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  auto pending = [&] {
    return std::any_of(all.begin(), all.end(), [](const auto& c) { return c->close_pending(); });
  };
  while (pending() && std::chrono::steady_clock::now() < deadline) ucp_worker_progress(worker());
  auto closing = std::move(closing_);
  closing_.clear();
  parked_.clear();
  for (auto& c : all) c->abandon();
  eps_.clear();
  closing.clear();
  all.clear();
}

}  // namespace blobpipe::ucx::detail
