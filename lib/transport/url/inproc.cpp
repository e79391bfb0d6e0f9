// inproc:// endpoints: see inproc.hpp.
#include "lib/transport/url/inproc.hpp"

#include <asio/error.hpp>
#include <asio/post.hpp>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>

#include "blobpipe/transport/loopback.hpp"
#include "lib/runtime/async_sync.hpp"

namespace blobpipe::detail {
namespace {

/// One named listener's side: what connect() hands over to accept().
struct hub {
  hub(asio::any_io_executor e, std::string n) : ex(std::move(e)), name(std::move(n)), ready(ex) {}
  asio::any_io_executor ex;
  std::string name;
  // On `ex` only.
  std::deque<std::unique_ptr<transport>> backlog;
  async_condition ready;
  bool closed = false;
  // Under the registry's mutex.
  std::uint64_t connections = 0;
};

struct registry {
  std::mutex m;
  std::map<std::string, std::weak_ptr<hub>, std::less<>> hubs;

  static registry& get() {
    static registry r;
    return r;
  }
};

class inproc_listener final : public listener {
 public:
  explicit inproc_listener(std::shared_ptr<hub> h) : h_(std::move(h)) {}
  ~inproc_listener() override { close(); }

  std::uint16_t port() const noexcept override { return 0; }

  asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> accept(
      transport_options) override {
    auto h = h_;  // alive across the wait
    while (h->backlog.empty() && !h->closed) {
      const bool cancelled = co_await h->ready.wait();
      if (cancelled)
        co_return std::tuple{std::error_code(asio::error::operation_aborted),
                             std::unique_ptr<transport>{}};
    }
    if (h->closed)
      co_return std::tuple{make_error_code(errc::closed), std::unique_ptr<transport>{}};
    auto t = std::move(h->backlog.front());
    h->backlog.pop_front();
    co_return std::tuple{std::error_code{}, std::move(t)};
  }

  void close() noexcept override {
    if (h_->closed) return;
    h_->closed = true;
    {
      auto& r = registry::get();
      std::lock_guard lock(r.m);
      auto it = r.hubs.find(h_->name);
      if (it != r.hubs.end() && it->second.lock() == h_) r.hubs.erase(it);
    }
    h_->backlog.clear();  // their connectors see peer_closed
    h_->ready.notify_all();
  }

 private:
  std::shared_ptr<hub> h_;
};

}  // namespace

result<std::unique_ptr<listener>> inproc_listen(asio::any_io_executor ex, const std::string& name) {
  auto& r = registry::get();
  std::lock_guard lock(r.m);
  auto& slot = r.hubs[name];
  if (!slot.expired()) return {errc::peer_failed, "listen on inproc://" + name + ": name in use"};
  auto h = std::make_shared<hub>(std::move(ex), name);
  slot = h;
  return std::unique_ptr<listener>(std::make_unique<inproc_listener>(std::move(h)));
}

std::tuple<std::error_code, std::unique_ptr<transport>> inproc_connect(asio::any_io_executor ex,
                                                                       const std::string& name,
                                                                       transport_options opt) {
  std::shared_ptr<hub> h;
  std::uint64_t n = 0;
  {
    auto& r = registry::get();
    std::lock_guard lock(r.m);
    auto it = r.hubs.find(name);
    if (it != r.hubs.end()) h = it->second.lock();
    if (h) n = ++h->connections;
  }
  if (!h) return {make_error_code(errc::peer_failed), nullptr};
  auto [mine, theirs] = loopback::make_pair(std::move(ex), h->ex, opt);
  mine->set_peer_address("inproc://" + name);
  theirs->set_peer_address("inproc://" + name + "#" + std::to_string(n));
  // The backlog belongs to the listener's executor. A listener closed
  // meanwhile drops the transport, which closes it: we see peer_closed.
  asio::post(h->ex, [h, t = std::move(theirs)]() mutable {
    if (h->closed) return;
    h->backlog.push_back(std::move(t));
    h->ready.notify_all();
  });
  return {std::error_code{}, std::move(mine)};
}

}  // namespace blobpipe::detail
