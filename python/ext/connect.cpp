// Making Senders and Consumers: _connect, _listen (Listener) and
// _loopback_pair. blobpipe._stream parses the URLs and wraps these with
// their public names and docstrings (connect, listen, loopback_pair).
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>

#include "blobpipe/transport/loopback.hpp"
#include "blobpipe/transport/tcp.hpp"
#include "blobpipe/transport/ucx.hpp"
#include "errors.hpp"
#include "stream.hpp"

namespace blobpipe::python {
namespace {

// How long a runtime that used UCX lets its io_context finish closing
// endpoints and listeners before it is stopped (io_runtime::set_stop_grace):
// a listener waits 2 s without requests before it is destroyed.
constexpr std::chrono::milliseconds ucx_stop_grace{5000};

bool is_ucx(const std::string& scheme) { return scheme == "ucx"; }

connect_fn connector(asio::any_io_executor ex, std::string scheme, std::string host,
                     std::uint16_t port) {
  return [ex, scheme, host, port]()
             -> asio::awaitable<std::tuple<std::error_code, std::unique_ptr<transport>>> {
    if (is_ucx(scheme)) co_return co_await ucx::connect(ex, host, port);
    co_return co_await tcp::connect(ex, host, port);
  };
}

py::object connect_sender(const std::string& scheme, const std::string& host,
                          std::uint16_t port, const std::string& url, const py::dict& kw) {
  const sender_settings settings = sender_settings_from(kw);
  auto rt = io_runtime::start();
  user_guard guard(rt);
  if (is_ucx(scheme)) rt->set_stop_grace(ucx_stop_grace);
  auto core = new_sender_core(rt->executor());
  auto done = std::make_shared<completion>();
  launch_sender(core, nullptr, connector(rt->executor(), scheme, host, port), settings.resend,
                settings.opt, done);
  done->wait();
  done->raise_if_failed("connect to " + url + ": ");
  guard.dismiss();
  return make_sender(std::move(rt), std::move(core), settings);
}

// ---- Listener ----

struct listener_core {
  explicit listener_core(asio::any_io_executor e) : ex(std::move(e)) {}
  asio::any_io_executor ex;
  std::unique_ptr<blobpipe::listener> l;  // io thread only
};

// One accept in flight, and the consumer it started.
struct pending_accept {
  std::shared_ptr<consumer_core> core;
  std::shared_ptr<completion> done = std::make_shared<completion>();
};

class listener_handle {
 public:
  listener_handle(std::shared_ptr<io_runtime> rt, std::shared_ptr<listener_core> core,
                  consumer_settings settings, std::uint16_t port)
      : rt_(std::move(rt)),
        core_(std::move(core)),
        settings_(std::move(settings)),
        port_(port),
        generation_(rt_->generation()) {}

  ~listener_handle() {
    if (generation_ != fork_generation()) {
      leak_in_child(std::move(core_));
      leak_in_child(std::move(rt_));
      return;
    }
    close();
  }

  listener_handle(const listener_handle&) = delete;
  listener_handle& operator=(const listener_handle&) = delete;

  std::uint16_t port() const { return port_; }

  py::object accept(py::handle timeout) {
    check_not_forked(generation_, "Listener");
    const auto deadline = deadline_after(timeout);
    for (;;) {
      if (closed_) raise_code(errc::closed, "accept: the Listener is closed");
      if (!pending_) start_accept();
      const auto p = pending_;  // another thread may take it while we wait
      if (!p->done->wait(deadline))
        raise_code(errc::timed_out, "accept: no connection within the timeout (the accept "
                                    "goes on: the next accept() takes its connection)");
      if (pending_ != p) continue;  // another accept() took this one
      pending_ = nullptr;
      p->done->raise_if_failed("accept: ");
      if (!rt_->add_user()) raise_code(errc::closed, "accept: the Listener's thread has stopped");
      return make_consumer(rt_, p->core, settings_);
    }
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    auto unclaimed = std::exchange(pending_, nullptr);
    // A thread waiting in accept() wakes with ClosedError at once.
    if (unclaimed) unclaimed->done->set(make_error_code(errc::closed), "the Listener is closed");
    auto closed = std::make_shared<completion>();
    asio::post(core_->ex, [c = core_, unclaimed, closed] {
      if (c->l) c->l->close();
      // A connection accepted after its accept() call gave up, that no
      // later accept() took: close its consumer (the sender sees it).
      if (unclaimed) close_consumer_core(*unclaimed->core);
      closed->set({});
    });
    py::gil_scoped_release nogil;
    closed->wait_nogil();
    rt_->release_user();  // consumers it accepted keep the thread running
  }

 private:
  void start_accept() {
    auto p = std::make_shared<pending_accept>();
    p->core = new_consumer_core(core_->ex);
    asio::co_spawn(
        core_->ex,
        [lc = core_, p, opt = settings_.opt]() -> asio::awaitable<void> {
          auto [ec, t] = co_await lc->l->accept();
          if (ec) {
            p->done->set(ec, ec == errc::closed ? "the Listener is closed"
                                                 : ec.message() + " (" + errc_name(ec) + ")");
            co_return;
          }
          auto [ec2, why] = co_await start_consumer(p->core, std::move(t), opt);
          // The Listener closed meanwhile: nobody will take this consumer.
          if (!p->done->set(ec2, std::move(why)) && !ec2) close_consumer_core(*p->core);
        },
        [p](std::exception_ptr e) {
          if (e) p->done->set(make_error_code(errc::closed), "blobpipe's background thread failed");
        });
    pending_ = std::move(p);
  }

  std::shared_ptr<io_runtime> rt_;
  std::shared_ptr<listener_core> core_;
  consumer_settings settings_;
  std::uint16_t port_;
  std::uint64_t generation_;
  bool closed_ = false;  // GIL
  std::shared_ptr<pending_accept> pending_;
};

struct py_listener {
  std::shared_ptr<listener_handle> h;
};

py::object listen_consumers(const std::string& scheme, const std::string& host,
                            std::uint16_t port, const std::string& url, const py::dict& kw) {
  consumer_settings settings = consumer_settings_from(kw);
  auto rt = io_runtime::start();
  user_guard guard(rt);
  if (is_ucx(scheme)) rt->set_stop_grace(ucx_stop_grace);
  auto core = std::make_shared<listener_core>(rt->executor());
  auto done = std::make_shared<completion>();
  auto bound = std::make_shared<std::uint16_t>(0);
  // Listening touches the io_context's services (UCX creates its context
  // and worker there): done on its thread.
  asio::post(core->ex, [core, scheme, host, port, done, bound] {
    auto made = [&]() -> result<std::unique_ptr<blobpipe::listener>> {
      if (is_ucx(scheme)) {
        auto l = ucx::listen(core->ex, port, host);
        if (!l) return l.err();
        return std::unique_ptr<blobpipe::listener>(std::make_unique<ucx::listener>(std::move(*l)));
      }
      auto l = tcp::listen(core->ex, port, host);
      if (!l) return l.err();
      return std::unique_ptr<blobpipe::listener>(std::make_unique<tcp::listener>(std::move(*l)));
    }();
    if (!made) {
      done->set(made.code(), made.message());
      return;
    }
    core->l = std::move(*made);
    *bound = core->l->port();
    done->set({});
  });
  done->wait();
  done->raise_if_failed("listen on " + url + ": ");
  guard.dismiss();
  return py::cast(py_listener{
      std::make_shared<listener_handle>(std::move(rt), std::move(core), std::move(settings), *bound)});
}

py::tuple loopback_pair(const py::dict& skw, const py::dict& ckw) {
  const sender_settings ss = sender_settings_from(skw);
  const consumer_settings cs = consumer_settings_from(ckw);
  if (ss.resend) throw py::value_error("resend sessions need connect() with a URL to reconnect to");
  auto rs = io_runtime::start();
  user_guard gs(rs);
  auto rc = io_runtime::start();
  user_guard gc(rc);
  auto [a, b] = loopback::make_pair(rs->executor(), rc->executor());
  auto score = new_sender_core(rs->executor());
  auto ccore = new_consumer_core(rc->executor());
  auto sd = std::make_shared<completion>();
  auto cd = std::make_shared<completion>();
  launch_consumer(ccore, std::move(b), cs.opt, cd);
  launch_sender(score, std::move(a), {}, false, ss.opt, sd);
  sd->wait();
  cd->wait();
  cd->raise_if_failed("loopback consumer: ");
  sd->raise_if_failed("loopback sender: ");
  gs.dismiss();
  gc.dismiss();
  py::object sender = make_sender(std::move(rs), std::move(score), ss);
  py::object consumer = make_consumer(std::move(rc), std::move(ccore), cs);
  return py::make_tuple(sender, consumer);
}

}  // namespace

void init_connect(py::module_& m) {
  m.def("_connect", &connect_sender, py::arg("scheme"), py::arg("host"), py::arg("port"),
        py::arg("url"), py::arg("options"));
  m.def("_listen", &listen_consumers, py::arg("scheme"), py::arg("host"), py::arg("port"),
        py::arg("url"), py::arg("options"));
  m.def("_loopback_pair", &loopback_pair, py::arg("sender_options"), py::arg("consumer_options"));

  py::class_<py_listener>(m, "Listener", R"(Accepts connections and gives a Consumer for each (blobpipe.listen).

    with blobpipe.listen("tcp://0.0.0.0:0", window_bytes=256 << 20) as listener:
        print("listening on port", listener.port)
        consumer = listener.accept()

Consumers it accepts run on the Listener's background thread (one thread
for the Listener and all of them), and outlive it: close() stops only
accepting. Connections are queued by the kernel (TCP) or by UCX until
accept() takes them.)")
      .def_property_readonly("port", [](const py_listener& l) { return l.h->port(); },
                             "The bound port (the one chosen for port 0).")
      .def("accept", [](py_listener& l, py::handle timeout) { return l.h->accept(timeout); },
           py::arg("timeout") = py::none(),
           R"(Waits for the next connection and its handshake, and returns its Consumer
(with the options given to listen()). timeout in seconds (None: no limit):
TimedOutError when none came in time (the next accept() takes the one
still on its way). Ctrl-C interrupts the wait. Raises ClosedError after
close(), ProtocolViolationError (a peer that is not a blobpipe sender),
PeerClosedError/PeerFailedError (the peer went away during the
handshake).)")
      .def("close", [](py_listener& l) { l.h->close(); },
           "Stops listening (the port is freed). Accepted Consumers go on. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_listener& l, py::handle, py::handle, py::handle) {
        l.h->close();
        return false;
      });
}

}  // namespace blobpipe::python
