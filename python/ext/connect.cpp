// Making Senders and Consumers: _connect, _listen (Listener),
// _loopback_pair and _parse_url. URLs are the C++ library's
// (blobpipe/transport/url.hpp: parse_url, check_connect_url, connector,
// listen), so Python and C++ accept the same URLs and say the same things
// about them; blobpipe._stream wraps these with their public names and
// docstrings (connect, listen, loopback_pair, parse_url).
#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/system_executor.hpp>

#include <deque>

#include "blobpipe/transport/loopback.hpp"
#include "blobpipe/transport/ucx.hpp"
#include "blobpipe/transport/url.hpp"
#include "lib/runtime/task_group.hpp"
#include "errors.hpp"
#include "state.hpp"
#include "stream.hpp"

namespace blobpipe::python {
namespace {

// The part of a URL that url.hpp's message blames, for URLError.part:
// "scheme", "port" or "host" (the message is read after its "URL '...': "
// prefix, so that the URL's own text cannot mislead).
std::string url_part(std::string_view url, std::string_view message) {
  if (const std::string prefix = "URL " + quote(url) + ": "; message.starts_with(prefix))
    message.remove_prefix(prefix.size());
  if (message.find("scheme") != std::string_view::npos) return "scheme";
  if (message.find("port") != std::string_view::npos || message.find("PORT") != std::string_view::npos)
    return message.find("IPv6") != std::string_view::npos ? "host" : "port";
  return "host";
}

// Raises URLError for an invalid_argument about `url`; other errors as
// their own class.
[[noreturn]] void raise_url_error(std::string_view url, const error& e) {
  if (e.code != errc::invalid_argument) raise(e);
  PyErr_SetObject(state().url_error.ptr(),
                  state().url_error(e.message, "invalid_argument", url_part(url, e.message)).ptr());
  throw py::error_already_set();
}

// (scheme, host, port) of `url`, as the C++ library parses it; with
// `listening` false, port 0 is refused as connect refuses it.
py::tuple parse_py_url(const std::string& url, bool listening) {
  result<endpoint_url> u = parse_url(url);
  if (!u) raise_url_error(url, u.err());
  if (!listening) {
    // connector() refuses what no connect can use (port 0), and only that.
    auto c = connector(asio::any_io_executor(asio::system_executor()), url);
    if (!c) raise_url_error(url, c.err());
  }
  if (u->scheme == url_scheme::ucx) {
    if (auto ok = ucx::check_host(u->host); !ok)
      raise_url_error(url, make_error(errc::invalid_argument, "URL " + quote(url) + ": " + ok.message()));
  }
  return py::make_tuple(scheme_name(u->scheme), u->host, u->port);
}

// How long a runtime that used UCX lets its io_context finish closing
// endpoints and listeners before it is stopped (io_runtime::set_stop_grace):
// a listener waits 2 s without requests before it is destroyed.
constexpr std::chrono::milliseconds ucx_stop_grace{5000};

py::object connect_sender(const std::string& url, const py::dict& kw) {
  const sender_settings settings = sender_settings_from(kw);
  auto rt = io_runtime::start();
  user_guard guard(rt);
  // What no retry can fix (a bad URL, a name that does not resolve) is
  // said now, once.
  result<endpoint_url> target = [&] {
    gil_released nogil;  // the name is looked up
    return check_connect_url(rt->executor(), url);
  }();
  if (!target) raise_url_error(url, target.err());
  if (target->scheme == url_scheme::ucx) rt->set_stop_grace(ucx_stop_grace);
  result<connect_function> connect = connector(rt->executor(), url);
  if (!connect) raise_url_error(url, connect.err());
  auto core = new_sender_core(rt->executor());
  auto done = std::make_shared<completion>();
  launch_sender(core, nullptr, std::move(*connect), settings.resend, settings.opt, done);
  try {
    done->wait();
  } catch (...) {
    // Ctrl-C: the io thread drops the attempt now, so that releasing the
    // runtime (guard) does not wait out its stop grace.
    cancel_launch(core);
    throw;
  }
  done->raise_if_failed("connect to " + url + ": ");
  guard.dismiss();
  return make_sender(std::move(rt), std::move(core), settings);
}

// ---- Listener ----
//
// Accepting never waits on one peer's handshake: silent sockets must not
// make accept() time out while a good sender queues behind them. While an accept() wants a Consumer, the
// io thread accepts every connection that comes and runs its handshake on
// its own; the first to finish goes to the waiting accept(), later ones
// queue for the next. A handshake that fails is its peer's affair: the
// connection is dropped and accept() goes on waiting. At most
// max_handshakes run at once: one more closes the oldest still running
// (a silent or trickling peer; an honest hello takes one round trip).

// Handshakes running at once per Listener, at most.
constexpr std::size_t max_handshakes = 64;

// One accept() call's wait, and the consumer handed to it.
struct pending_accept {
  std::shared_ptr<consumer_core> core;  // set on the io thread before done
  std::shared_ptr<completion> done = std::make_shared<completion>();
};

struct listener_core {
  explicit listener_core(asio::any_io_executor e) : ex(e), handshakes(std::move(e)) {}
  asio::any_io_executor ex;
  std::unique_ptr<url_listener> l;  // io thread only
  // io thread only, below.
  struct handshake {
    std::uint64_t id = 0;
    transport* raw = nullptr;  // the connection, until its handshake ends
  };
  std::deque<std::shared_ptr<consumer_core>> ready;  // handshakes done, not taken yet
  std::shared_ptr<pending_accept> waiter;            // the accept() waiting for one
  std::deque<handshake> handshaking;                 // oldest first
  std::uint64_t next_handshake = 0;
  // Each connection's handshake (run_handshake). close() ends them by
  // closing their transports (handshaking), not by cancelling: a UCX wait
  // cancelled mid-request would leave the request to nobody.
  blobpipe::detail::task_group handshakes;
  bool looping = false;  // accept_loop runs
  bool closed = false;
};

// Hands `core` to the waiting accept(), or queues it for the next one.
// REQUIRES: on the io thread.
void hand_over(listener_core& lc, std::shared_ptr<consumer_core> core) {
  if (auto w = std::exchange(lc.waiter, nullptr)) {
    w->core = core;
    if (!w->done->set({})) close_consumer_core(*core);  // the Listener closed
    return;
  }
  lc.ready.push_back(std::move(core));
}

asio::awaitable<void> run_handshake(std::shared_ptr<listener_core> lc,
                                    std::unique_ptr<transport> t, consumer_options opt) {
  const std::uint64_t id = ++lc->next_handshake;
  lc->handshaking.push_back({id, t.get()});
  auto core = new_consumer_core(lc->ex);
  auto [ec, why] = co_await start_consumer(core, std::move(t), std::move(opt));
  for (auto it = lc->handshaking.begin(); it != lc->handshaking.end(); ++it)
    if (it->id == id) {
      lc->handshaking.erase(it);
      break;
    }
  if (ec) co_return;  // the peer's failure, not the Listener's: dropped
  if (lc->closed) {
    close_consumer_core(*core);
    co_return;
  }
  hand_over(*lc, std::move(core));
}

// Accepts while an accept() waits or nothing is ready for the next one.
asio::awaitable<void> accept_loop(std::shared_ptr<listener_core> lc, consumer_options opt) {
  lc->looping = true;
  while (!lc->closed && (lc->waiter || lc->ready.empty())) {
    auto [ec, t] = co_await lc->l->accept();
    if (lc->closed) break;
    if (ec) {
      // The listener's own failure: the waiting accept() raises it (a
      // later accept() tries again).
      if (auto w = std::exchange(lc->waiter, nullptr))
        w->done->set(ec, ec == errc::closed ? "the Listener is closed"
                                            : ec.message() + " (" + errc_name(ec) + ")");
      break;
    }
    if (lc->handshaking.size() >= max_handshakes) {
      // Room for this one: the oldest handshake gives way (its coroutine
      // ends with the transport closed and leaves the list itself).
      for (auto& h : lc->handshaking)
        if (h.raw) {
          std::exchange(h.raw, nullptr)->close();
          break;
        }
    }
    lc->handshakes.spawn(run_handshake(lc, std::move(t), opt));
  }
  lc->looping = false;
}

// An accept() wants a Consumer: a ready one, or the next handshake done.
// REQUIRES: on the io thread.
void want_consumer(const std::shared_ptr<listener_core>& lc, std::shared_ptr<pending_accept> p,
                   const consumer_options& opt) {
  if (lc->closed) {
    p->done->set(make_error_code(errc::closed), "the Listener is closed");
    return;
  }
  if (!lc->ready.empty()) {
    p->core = std::move(lc->ready.front());
    lc->ready.pop_front();
    if (!p->done->set({})) close_consumer_core(*p->core);
    return;
  }
  lc->waiter = std::move(p);
  if (!lc->looping)
    asio::co_spawn(lc->ex, accept_loop(lc, opt), [lc](std::exception_ptr e) {
      lc->looping = false;
      if (!e) return;
      if (auto w = std::exchange(lc->waiter, nullptr))
        w->done->set(make_error_code(errc::closed), "blobpipe's background thread failed");
    });
}

class listener_handle {
 public:
  listener_handle(std::shared_ptr<io_runtime> rt, std::shared_ptr<listener_core> core,
                  consumer_settings settings, std::uint16_t port, std::string url)
      : rt_(std::move(rt)),
        core_(std::move(core)),
        settings_(std::move(settings)),
        port_(port),
        url_(std::move(url)),
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
  const std::string& url() const { return url_; }

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
    // A forked child's copy: its background thread is the parent's, so
    // there is nothing to close here (the destructor leaks it, runtime.hpp).
    if (generation_ != fork_generation()) return;
    if (closed_) return;
    closed_ = true;
    auto unclaimed = std::exchange(pending_, nullptr);
    // A thread waiting in accept() wakes with ClosedError at once.
    if (unclaimed) unclaimed->done->set(make_error_code(errc::closed), "the Listener is closed");
    auto closed = std::make_shared<completion>();
    asio::post(core_->ex, [c = core_, unclaimed, closed] {
      c->closed = true;
      if (c->l) c->l->close();
      // A connection handed over after its accept() call gave up, that no
      // later accept() took, and those queued for later: close their
      // consumers (the senders see it); handshakes under way end.
      if (unclaimed && unclaimed->core) close_consumer_core(*unclaimed->core);
      for (auto& core : c->ready) close_consumer_core(*core);
      c->ready.clear();
      c->waiter = nullptr;
      for (auto& h : c->handshaking)
        if (h.raw) std::exchange(h.raw, nullptr)->close();
      closed->set({});
    });
    gil_released nogil;
    closed->wait_nogil();
    rt_->release_user();  // consumers it accepted keep the thread running
  }

 private:
  void start_accept() {
    auto p = std::make_shared<pending_accept>();
    asio::post(core_->ex, [lc = core_, p, opt = settings_.opt] { want_consumer(lc, p, opt); });
    pending_ = std::move(p);
  }

  std::shared_ptr<io_runtime> rt_;
  std::shared_ptr<listener_core> core_;
  consumer_settings settings_;
  std::uint16_t port_;
  std::string url_;
  std::uint64_t generation_;
  bool closed_ = false;  // GIL
  std::shared_ptr<pending_accept> pending_;
};

struct py_listener {
  std::shared_ptr<listener_handle> h;
};

py::object listen_consumers(const std::string& url, const py::dict& kw) {
  consumer_settings settings = consumer_settings_from(kw);
  result<endpoint_url> parsed = parse_url(url);
  if (!parsed) raise_url_error(url, parsed.err());
  auto rt = io_runtime::start();
  user_guard guard(rt);
  if (parsed->scheme == url_scheme::ucx) rt->set_stop_grace(ucx_stop_grace);
  auto core = std::make_shared<listener_core>(rt->executor());
  auto done = std::make_shared<completion>();
  auto bound = std::make_shared<std::pair<std::uint16_t, std::string>>();
  auto refused = std::make_shared<error>();  // invalid_argument: a URLError
  // Listening touches the io_context's services (UCX creates its context
  // and worker there): done on its thread.
  asio::post(core->ex, [core, url, done, bound, refused] {
    auto made = listen(core->ex, url);
    if (!made) {
      if (made.code() == errc::invalid_argument) *refused = made.err();
      done->set(made.code(), made.message());
      return;
    }
    core->l = std::move(*made);
    *bound = {core->l->port(), core->l->url()};
    done->set({});
  });
  done->wait();
  if (done->code() == errc::invalid_argument) raise_url_error(url, *refused);
  if (const std::error_code ec = done->code()) {
    // This host refused the address (in use, not local): an OSError, as
    // bind() raises, not a failure of a peer.
    const std::string m = done->message();
    py::object exc = py::module_::import("blobpipe._errors")
                         .attr("ListenError")("listen on " + url + ": " + (m.empty() ? ec.message() : m),
                                              errc_name(ec));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    throw py::error_already_set();
  }
  guard.dismiss();
  return py::cast(py_listener{
      std::make_shared<listener_handle>(std::move(rt), std::move(core), std::move(settings),
                                        bound->first, bound->second)});
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
  try {
    sd->wait();
    cd->wait();
  } catch (...) {
    cancel_launch(score);
    throw;
  }
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
  m.def("_connect", &connect_sender, py::arg("url"), py::arg("options"));
  m.def("_listen", &listen_consumers, py::arg("url"), py::arg("options"));
  m.def("_parse_url", &parse_py_url, py::arg("url"), py::arg("listening"));
  m.def("_loopback_pair", &loopback_pair, py::arg("sender_options"), py::arg("consumer_options"));

  py::class_<py_listener>(m, "Listener", R"(Accepts connections and gives a Consumer for each (blobpipe.listen).

    with blobpipe.listen("tcp://0.0.0.0:0", window_bytes=256 << 20) as listener:
        print("listening on port", listener.port)
        consumer = listener.accept()

Consumers it accepts run on the Listener's background thread (one thread
for the Listener and all of them), and outlive it: close() stops only
accepting. While an accept() waits, connections are taken at once and
their handshakes run side by side; otherwise they are queued by the kernel
(TCP) or by UCX until accept() takes them.)")
      .def_property_readonly("port", [](const py_listener& l) { return l.h->port(); },
                             "The bound port (the one chosen for port 0).")
      .def_property_readonly("url", [](const py_listener& l) { return l.h->url(); },
                             "The URL a peer connects to: the address listened on (a name\n"
                             "resolved) and the bound port, e.g. tcp://127.0.0.1:40123.")
      .def("accept", [](py_listener& l, py::handle timeout) { return l.h->accept(timeout); },
           py::arg("timeout") = py::none(),
           R"(Waits for the next connection whose handshake completes, and returns its
Consumer (with the options given to listen()). Handshakes run concurrently
on the Listener's thread (up to 64 at once; one more closes the oldest
still running), so a silent or slow peer never holds up a sender behind
it; a connection whose handshake fails (not a blobpipe sender, gone,
past handshake_timeout) is closed and accept() goes on waiting. Handshakes
under way when a connection is handed over still complete and wait,
answered, for the next accept() calls; close() closes those still
waiting, and what their senders sent is lost. timeout
in seconds (None: no limit): TimedOutError when none came in time (the
next accept() takes the one still on its way). Ctrl-C interrupts the
wait. Raises ClosedError after close(), and the listener's own errors
(PeerFailedError: out of descriptors, say).)")
      .def("close", [](py_listener& l) { l.h->close(); },
           "Stops listening (the port is freed). Accepted Consumers go on. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](py_listener& l, py::handle, py::handle, py::handle) {
        l.h->close();
        return false;
      });
}

}  // namespace blobpipe::python
