// ucx_raw_bench — what UCX itself gives a program connected the way
// blobpipe's UCX transport is, with no blobpipe and no Asio in the way.
//
// It is the middle column of bench/ucx_bench.sh: between ucx_perftest
// (endpoints from exchanged worker addresses) and //bench:ucx_bench
// (blobpipe's transport), it separates what the connection style costs
// inside UCX from what blobpipe's own event loop and coroutines cost.
//
// Same as blobpipe's transport (lib/transport/ucx): endpoints created from
// worker addresses exchanged over a TCP socket (--connect address, the
// default: blobpipe's rendezvous, without its checks), or a ucp_listener
// and an endpoint created from a socket address (--connect listener,
// UCP_EP_PARAMS_FLAGS_CLIENT_SERVER; UCX's sockaddr connection manager,
// which blobpipe does not use: docs/ucx.md "Connecting");
// UCP_ERR_HANDLING_MODE_PEER on both ends, one active message per frame
// with a 24-byte header (ucp_am_send_nbx, UCP_AM_SEND_FLAG_REPLY), and the
// payload of a rendezvous frame landed with ucp_am_recv_data_nbx. Same as
// ucx_perftest's ucp_am_bw: the receiver calls ucp_am_recv_data_nbx inside
// the active-message callback, every payload lands in one buffer, and both
// ends poll ucp_worker_progress in a loop (no event fd). The sender keeps
// --window sends outstanding; after warm-up and after the timed run the
// receiver answers with an ack message, and the time covers delivery.
//
// Source: UCX examples/ucp_client_server.c (listener and endpoints),
// src/tools/perf/lib/ucp_tests.cc (am_bw's receive path).
//
//   ucx_raw_bench --server [--port P] [--size BYTES (1..2^30)] [--iters N] [--warmup N]
//                 [--connect address|listener]
//   ucx_raw_bench --client HOST [same options] [--window W]
//
// Prints "ucx-raw size=S iters=N window=W: X MB/s" (MB = 2^20 bytes).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr unsigned am_frame = 0;
constexpr unsigned am_ack = 1;
constexpr std::size_t header_bytes = 24;  // blobpipe's frame header size
constexpr std::size_t max_size = std::size_t(1) << 30;  // --size limit, bytes

struct args {
  bool server = false;
  std::string host;
  unsigned port = 13337;
  std::size_t size = 1 << 20;
  long iters = 2000;
  long warmup = 100;
  long window = 8;
  bool by_address = true;  // --connect address (default) or listener
};

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: ucx_raw_bench (--server | --client HOST) [--port P] [--size BYTES]\n"
               "                     [--iters N] [--warmup N] [--window W]\n"
               "                     [--connect address|listener]\n");
  std::exit(2);
}

args parse(int argc, char** argv) {
  args a;
  bool role = false;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    auto number = [&]() -> long {
      char* end = nullptr;
      const char* s = next();
      errno = 0;
      long v = std::strtol(s, &end, 10);
      if (*s == '\0' || *end != '\0' || errno == ERANGE || v < 1) usage();
      return v;
    };
    if (k == "--server") {
      a.server = role = true;
    } else if (k == "--client") {
      a.host = next();
      role = true;
    } else if (k == "--port") {
      long v = number();
      if (v > 65535) usage();
      a.port = unsigned(v);
    } else if (k == "--size") {
      a.size = std::size_t(number());
      if (a.size > max_size) usage();  // allocated at once, at both ends
    } else if (k == "--iters") {
      a.iters = number();
    } else if (k == "--warmup") {
      a.warmup = number();
    } else if (k == "--window") {
      a.window = number();
    } else if (k == "--connect") {
      const std::string how = next();
      if (how != "address" && how != "listener") usage();
      a.by_address = how == "address";
    } else {
      usage();
    }
  }
  if (!role) usage();
  return a;
}

[[noreturn]] void die(const char* what, ucs_status_t st) {
  std::fprintf(stderr, "ucx_raw_bench: %s: %s\n", what, ucs_status_string(st));
  std::exit(1);
}

// The handles, released in reverse order of creation.
struct context_del {
  void operator()(ucp_context_h c) const noexcept { ucp_cleanup(c); }
};
struct worker_del {
  void operator()(ucp_worker_h w) const noexcept { ucp_worker_destroy(w); }
};
struct listener_del {
  void operator()(ucp_listener_h l) const noexcept { ucp_listener_destroy(l); }
};

// State the callbacks touch; one per process, single-threaded.
struct state {
  ucp_worker_h worker = nullptr;
  ucp_conn_request_h conn_request = nullptr;
  ucp_ep_h reply_ep = nullptr;
  std::vector<char> dest;
  long received = 0;    // server: payloads landed
  long sends_done = 0;  // client: sends completed
  long acks = 0;        // client: acks received
  bool failed = false;
  bool done = false;    // the run is over: a peer closing now is no failure
};
state g;

void wait_request(void* r, const char* what) {
  if (UCS_PTR_IS_ERR(r)) die(what, UCS_PTR_STATUS(r));
  if (r == nullptr) return;
  ucs_status_t st;
  while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS) ucp_worker_progress(g.worker);
  ucp_request_free(r);
  if (st != UCS_OK) die(what, st);
}

void on_recv_done(void* request, ucs_status_t st, std::size_t, void*) {
  if (st != UCS_OK) g.failed = true;
  ++g.received;
  ucp_request_free(request);
}

ucs_status_t on_frame(void*, const void*, std::size_t, void* data, std::size_t length,
                      const ucp_am_recv_param_t* param) {
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) g.reply_ep = param->reply_ep;
  if (length != g.dest.size()) {
    g.failed = true;
    return UCS_OK;
  }
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {  // eager: one copy
    std::memcpy(g.dest.data(), data, length);
    ++g.received;
    return UCS_OK;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  p.cb.recv_am = on_recv_done;
  void* r = ucp_am_recv_data_nbx(g.worker, data, g.dest.data(), length, &p);
  if (UCS_PTR_IS_ERR(r)) g.failed = true;
  if (!UCS_PTR_IS_PTR(r)) ++g.received;
  return UCS_INPROGRESS;  // UCX owns `data` until the fetch is done
}

ucs_status_t on_ack(void*, const void*, std::size_t, void*, std::size_t,
                    const ucp_am_recv_param_t*) {
  ++g.acks;
  return UCS_OK;
}

void on_send_done(void* request, ucs_status_t st, void*) {
  if (st != UCS_OK) g.failed = true;
  ++g.sends_done;
  ucp_request_free(request);
}

void on_ep_error(void*, ucp_ep_h, ucs_status_t st) {
  if (g.done) return;
  std::fprintf(stderr, "ucx_raw_bench: endpoint error: %s\n", ucs_status_string(st));
  g.failed = true;
}

void set_handler(unsigned id, ucp_am_recv_callback_t cb) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = id;
  p.cb = cb;
  p.flags = UCP_AM_FLAG_WHOLE_MSG;
  if (auto st = ucp_worker_set_am_recv_handler(g.worker, &p); st != UCS_OK)
    die("ucp_worker_set_am_recv_handler", st);
}

sockaddr_in resolve(const std::string& host, unsigned port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(std::uint16_t(port));
  if (host.empty()) return sa;  // INADDR_ANY
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) {
    std::fprintf(stderr, "ucx_raw_bench: cannot resolve %s\n", host.c_str());
    std::exit(1);
  }
  sa.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return sa;
}

ucp_ep_params_t endpoint_params() {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = on_ep_error;
  return p;
}

void close_endpoint(ucp_ep_h ep) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(g.worker);
    ucp_request_free(r);
  }
}

// --connect address: this worker's address and the peer's, swapped over a
// connected socket (u32 length, then the bytes, each way).
std::vector<char> swap_addresses(int fd) {
  ucp_address_t* own = nullptr;
  std::size_t own_len = 0;
  if (auto st = ucp_worker_get_address(g.worker, &own, &own_len); st != UCS_OK)
    die("ucp_worker_get_address", st);
  auto io = [fd](auto op, void* p, std::size_t n) {
    for (std::size_t done = 0; done < n;) {
      const ssize_t k = op(fd, static_cast<char*>(p) + done, n - done);
      if (k <= 0) {
        std::fprintf(stderr, "ucx_raw_bench: address exchange failed\n");
        std::exit(1);
      }
      done += std::size_t(k);
    }
  };
  auto put = [](int f, char* p, std::size_t n) { return ::send(f, p, n, MSG_NOSIGNAL); };
  auto get = [](int f, char* p, std::size_t n) { return ::recv(f, p, n, 0); };
  std::uint32_t n = std::uint32_t(own_len);
  io(put, &n, sizeof n);
  io(put, own, own_len);
  ucp_worker_release_address(g.worker, own);
  io(get, &n, sizeof n);
  if (n == 0 || n > (1u << 20)) {
    std::fprintf(stderr, "ucx_raw_bench: peer address of %u bytes\n", n);
    std::exit(1);
  }
  std::vector<char> peer(n);
  io(get, peer.data(), n);
  return peer;
}

ucp_ep_h endpoint_to(const std::vector<char>& peer) {
  ucp_ep_params_t ep = endpoint_params();
  ep.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer.data());
  ucp_ep_h e = nullptr;
  if (auto st = ucp_ep_create(g.worker, &ep, &e); st != UCS_OK) die("ucp_ep_create", st);
  return e;
}

// The server's endpoint: from the one connection request (--connect
// listener), or from the address the one client sends (--connect address).
ucp_ep_h accept_one(const args& a) {
  sockaddr_in sa = resolve("", a.port);
  if (a.by_address) {
    const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    const int on = 1;
    ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (::bind(lfd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0 ||
        ::listen(lfd, 1) != 0) {
      std::perror("ucx_raw_bench: listen");
      std::exit(1);
    }
    const int fd = ::accept(lfd, nullptr, nullptr);
    ::close(lfd);
    ucp_ep_h e = endpoint_to(swap_addresses(fd));
    ::close(fd);
    return e;
  }
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  lp.sockaddr.addrlen = sizeof sa;
  lp.conn_handler.cb = [](ucp_conn_request_h r, void*) { g.conn_request = r; };
  ucp_listener_h raw_listener = nullptr;
  if (auto st = ucp_listener_create(g.worker, &lp, &raw_listener); st != UCS_OK)
    die("ucp_listener_create", st);
  std::unique_ptr<ucp_listener, listener_del> listener(raw_listener);
  while (g.conn_request == nullptr) ucp_worker_progress(g.worker);
  ucp_ep_params_t ep = endpoint_params();
  ep.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
  ep.conn_request = g.conn_request;
  ucp_ep_h e = nullptr;
  if (auto st = ucp_ep_create(g.worker, &ep, &e); st != UCS_OK) die("ucp_ep_create", st);
  return e;
}

// Receives warmup + iters frames, acking after each phase.
int serve(const args& a) {
  ucp_ep_h e = accept_one(a);
  g.dest.assign(a.size, 0);
  for (long phase_end : {a.warmup, a.warmup + a.iters}) {
    while (g.received < phase_end && !g.failed) ucp_worker_progress(g.worker);
    if (g.failed) break;
    ucp_request_param_t p{};
    wait_request(ucp_am_send_nbx(e, am_ack, nullptr, 0, nullptr, 0, &p), "ack");
  }
  // Let the client read the last ack and close first.
  g.done = !g.failed;
  for (int i = 0; i < 100000 && !g.failed; ++i) ucp_worker_progress(g.worker);
  close_endpoint(e);
  return g.failed ? 1 : 0;
}

// Sends n frames with a.window outstanding, then waits for the ack.
double round(ucp_ep_h e, const args& a, long n, const std::vector<char>& src) {
  const auto start = std::chrono::steady_clock::now();
  std::array<char, header_bytes> header{};
  const long acks = g.acks;
  long issued = 0;
  g.sends_done = 0;
  while (g.sends_done < n && !g.failed) {
    while (issued < n && issued - g.sends_done < a.window) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS;
      p.cb.send = on_send_done;
      p.flags = UCP_AM_SEND_FLAG_REPLY;
      void* r = ucp_am_send_nbx(e, am_frame, header.data(), header.size(), src.data(),
                                src.size(), &p);
      ++issued;
      if (UCS_PTR_IS_ERR(r)) die("ucp_am_send_nbx", UCS_PTR_STATUS(r));
      if (r == nullptr) ++g.sends_done;
    }
    ucp_worker_progress(g.worker);
  }
  while (g.acks == acks && !g.failed) ucp_worker_progress(g.worker);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

ucp_ep_h connect_one(const args& a) {
  sockaddr_in sa = resolve(a.host, a.port);
  if (a.by_address) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) {
      // bench/ucx_bench.sh retries on this line (the server is not up yet).
      std::fprintf(stderr, "ucx_raw_bench: connect: not listening yet\n");
      std::exit(1);
    }
    ucp_ep_h e = endpoint_to(swap_addresses(fd));
    ::close(fd);
    return e;
  }
  ucp_ep_params_t ep = endpoint_params();
  ep.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep.sockaddr.addrlen = sizeof sa;
  ucp_ep_h e = nullptr;
  if (auto st = ucp_ep_create(g.worker, &ep, &e); st != UCS_OK) die("ucp_ep_create", st);
  return e;
}

int run_client(const args& a) {
  ucp_ep_h e = connect_one(a);
  ucp_request_param_t fp{};
  wait_request(ucp_ep_flush_nbx(e, &fp), "connect (ucp_ep_flush_nbx)");
  std::vector<char> src(a.size, 0x5a);
  round(e, a, a.warmup, src);
  double secs = round(e, a, a.iters, src);
  g.done = !g.failed;
  close_endpoint(e);
  if (g.failed) return 1;
  std::printf("ucx-raw size=%zu iters=%ld window=%ld: %.2f MB/s\n", a.size, a.iters, a.window,
              double(a.size) * double(a.iters) / (1024.0 * 1024.0) / secs);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const args a = parse(argc, argv);
  ucp_params_t pp{};
  pp.field_mask = UCP_PARAM_FIELD_FEATURES;
  pp.features = UCP_FEATURE_AM;
  ucp_context_h raw_context = nullptr;
  if (auto st = ucp_init(&pp, nullptr, &raw_context); st != UCS_OK) die("ucp_init", st);
  std::unique_ptr<ucp_context, context_del> context(raw_context);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h raw_worker = nullptr;
  if (auto st = ucp_worker_create(context.get(), &wp, &raw_worker); st != UCS_OK)
    die("ucp_worker_create", st);
  std::unique_ptr<ucp_worker, worker_del> worker(raw_worker);
  g.worker = worker.get();
  set_handler(am_frame, on_frame);
  set_handler(am_ack, on_ack);
  return a.server ? serve(a) : run_client(a);
}
