// UCX's own tcp transport ports (docs/ucx.md "Foreign bytes"). UCX 1.13
// aborts a process on 24 forged bytes sent to the port its tcp transport
// listens on, one per interface it finds. A listener bound to one address
// confines UCX's tcp to that address's interface
// (options::tcp_on_listen_interface_only; lib/transport/ucx/devices.hpp):
// while a connection over it is open, every listening socket of this
// process other than the rendezvous's is on that address, and bytes still
// cross. The user's own choice stands (UCX_NET_DEVICES in the environment
// or in options::config, the option false), a listener on 0.0.0.0 changes
// nothing, and a later listener on another interface of the same io_context
// is refused. The value blobpipe gives UCX_NET_DEVICES keeps every network
// device of UCX's other transports (RDMA ports), checked on made-up device
// lists, since this machine has none.
//
// Whether there is anything to confine is measured, not assumed: the cases
// first list UCX's ports with the option off, and skip (saying so) when
// UCX's tcp listens on no address but 127.0.0.1 then.
#define BOOST_TEST_MODULE ucx_tcp_ports
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "lib/transport/ucx/devices.hpp"
#include "test/listening_ports.hpp"
#include "test/process.hpp"
#include "test/ucx_frame_fixture.hpp"

using namespace blobpipe;
using namespace blobpipe::testing;

namespace {

using port_list = std::vector<std::pair<std::string, std::uint16_t>>;

/// What one listen/connect showed.
struct seen {
  std::string error;     ///< the listen, connect or accept that failed; empty if none did
  bool crossed = false;  ///< "ping" written on the connected end arrived on the accepted one
  std::string cross_why;  ///< what happened instead
  std::string lanes;     ///< ucx::describe of the connected end
  port_list ucx_ports;   ///< this process's listening sockets but the rendezvous's
};

/// Listens on `listen_on` with `o` on an io_context of its own (so a UCX
/// context of its own), connects to it at `connect_to`, sends "ping"
/// across, and lists UCX's listening sockets while the connection is open.
/// Everything is closed (and UCX's ports with the worker) on return.
seen listen_connect_look(const std::string& listen_on, const std::string& connect_to,
                         const ucx::options& o) {
  seen s;
  runner r;
  auto body = [&]() -> asio::awaitable<void> {
    auto lis = ucx::listen(r.ex(), 0, listen_on, o);
    if (!lis) {
      s.error = "listen on " + listen_on + ": " + lis.message();
      co_return;
    }
    auto [cec, a] = co_await ucx::connect(r.ex(), connect_to, lis->port(), {}, o);
    if (cec) {
      s.error = "connect to " + connect_to + ": " + cec.message();
      co_return;
    }
    auto [aec, b] = co_await lis->accept();
    if (aec) {
      s.error = "accept: " + aec.message();
      co_return;
    }
    const std::array<asio::const_buffer, 1> ping{asio::buffer("ping", 4)};
    const auto wec = co_await a->write(ping);
    std::array<std::byte, 64> buf{};  // read_some takes 64 bytes at least (a bulk header)
    auto [rec, got] = co_await b->read_some(buf);
    s.crossed = !wec && !rec && got.bytes == 4 && std::memcmp(buf.data(), "ping", 4) == 0;
    if (!s.crossed)
      s.cross_why = "write: " + wec.message() + ", read: " + rec.message() + ", " +
                    std::to_string(got.bytes) + " bytes";
    if (auto d = ucx::describe(*a)) s.lanes = *d;
    s.ucx_ports = listening_ports(::getpid());
    std::erase_if(s.ucx_ports,
                  [&](const auto& p) { return p.first == listen_on && p.second == lis->port(); });
    a->close();
    b->close();
    lis->close();
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
  return s;
}

/// The ports of `ports` not on `address`.
port_list not_on(const port_list& ports, const std::string& address) {
  port_list out;
  for (const auto& p : ports)
    if (p.first != address) out.push_back(p);
  return out;
}

std::string text(const port_list& ports) {
  std::ostringstream os;
  for (const auto& [host, port] : ports) os << " " << host << ":" << port;
  return ports.empty() ? " none" : os.str();
}

const ucx_link& tcp_link() { return ucx_links()[0]; }

ucx::options unconfined() {
  ucx::options o = tcp_link().opt;
  o.tcp_on_listen_interface_only = false;
  return o;
}

/// UCX's tcp ports with the option off, a listener on 127.0.0.1: where UCX
/// listens by itself (here 127.0.0.1 and eth0's address). Measured once.
const port_list& ports_unconfined() {
  static const port_list ports = [] {
    const auto s = listen_connect_look("127.0.0.1", "127.0.0.1", unconfined());
    BOOST_TEST_REQUIRE(s.error.empty(), s.error);
    BOOST_TEST(s.crossed, s.cross_why);
    return s.ucx_ports;
  }();
  return ports;
}

/// An IPv4 address of another interface than lo that UCX's tcp listens on
/// by itself; empty when there is none.
std::string other_interface_address() {
  for (const auto& [host, port] : not_on(ports_unconfined(), "127.0.0.1"))
    if (host.find(':') == std::string::npos && host != "0.0.0.0") return host;
  return {};
}

#define SKIP_UNLESS_UCX_TCP_LISTENS_BEYOND_LO()                                                 \
  do {                                                                                        \
    BLOBPIPE_SKIP_UNLESS_OFFERED(tcp_link());                                                 \
    if (other_interface_address().empty())                                                    \
      BLOBPIPE_SKIP("UCX's tcp transport listens on no IPv4 address but 127.0.0.1 here even " \
                    "unconfined (its ports:"                                                  \
                    << text(ports_unconfined()) << "), so confining it shows nothing");       \
  } while (0)

struct scoped_env {
  const char* name;
  scoped_env(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
  ~scoped_env() { ::unsetenv(name); }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;
};

}  // namespace

// The trainer's case: a listener on one address. Unconfined, UCX's tcp
// listens on every interface it finds (the control: what
// ports_unconfined() measured); confined, on the listener's only, and the
// connection still runs over tcp on it.
BOOST_AUTO_TEST_CASE(ucx_tcp_listens_only_on_the_interface_of_a_listener_on_127_0_0_1) {
  SKIP_UNLESS_UCX_TCP_LISTENS_BEYOND_LO();
  BOOST_TEST_MESSAGE("unconfined, UCX's tcp listens on" << text(ports_unconfined()));
  ::unsetenv("UCX_NET_DEVICES");  // the user's would stand (bazel's test environment has none)
  const auto s = listen_connect_look("127.0.0.1", "127.0.0.1", tcp_link().opt);
  BOOST_TEST_REQUIRE(s.error.empty(), s.error);
  BOOST_TEST(s.crossed, s.cross_why);
  BOOST_TEST(s.lanes.find("tcp/lo") != std::string::npos, s.lanes);
  BOOST_TEST_REQUIRE(!s.ucx_ports.empty(), "found no port of UCX's tcp transport");
  BOOST_TEST(not_on(s.ucx_ports, "127.0.0.1").empty(),
             "UCX's tcp also listens on" << text(not_on(s.ucx_ports, "127.0.0.1")));
}

// The same on another interface (eth0 here): UCX's tcp only there, not on
// 127.0.0.1, and the connection runs over it.
BOOST_AUTO_TEST_CASE(ucx_tcp_listens_only_on_the_interface_of_a_listener_on_another_address) {
  SKIP_UNLESS_UCX_TCP_LISTENS_BEYOND_LO();
  const std::string addr = other_interface_address();
  const auto s = listen_connect_look(addr, addr, tcp_link().opt);
  BOOST_TEST_REQUIRE(s.error.empty(), s.error);
  BOOST_TEST(s.crossed, s.cross_why);
  BOOST_TEST(s.lanes.find("tcp/") != std::string::npos, s.lanes);
  BOOST_TEST(s.lanes.find("tcp/lo") == std::string::npos, s.lanes);
  BOOST_TEST_REQUIRE(!s.ucx_ports.empty(), "found no port of UCX's tcp transport");
  BOOST_TEST(not_on(s.ucx_ports, addr).empty(),
             "UCX's tcp also listens on" << text(not_on(s.ucx_ports, addr)));
}

// The user's choice stands: UCX_NET_DEVICES in the environment, NET_DEVICES
// in options::config, or the option off leave UCX's tcp on every
// interface, as a listener on 0.0.0.0 does.
BOOST_AUTO_TEST_CASE(the_users_devices_the_opt_out_and_a_listener_on_0_0_0_0_leave_ucx_tcp_as_is) {
  SKIP_UNLESS_UCX_TCP_LISTENS_BEYOND_LO();
  {
    scoped_env all("UCX_NET_DEVICES", "all");
    const auto s = listen_connect_look("127.0.0.1", "127.0.0.1", tcp_link().opt);
    BOOST_TEST_REQUIRE(s.error.empty(), s.error);
    BOOST_TEST(s.crossed, s.cross_why);
    BOOST_TEST(!not_on(s.ucx_ports, "127.0.0.1").empty(),
               "UCX_NET_DEVICES=all in the environment, UCX's tcp listens on" << text(s.ucx_ports));
  }
  {
    ucx::options o = tcp_link().opt;
    o.config.emplace_back("NET_DEVICES", "all");
    const auto s = listen_connect_look("127.0.0.1", "127.0.0.1", o);
    BOOST_TEST_REQUIRE(s.error.empty(), s.error);
    BOOST_TEST(s.crossed, s.cross_why);
    BOOST_TEST(!not_on(s.ucx_ports, "127.0.0.1").empty(),
               "NET_DEVICES=all in options::config, UCX's tcp listens on" << text(s.ucx_ports));
  }
  {
    const auto s = listen_connect_look("0.0.0.0", "127.0.0.1", tcp_link().opt);
    BOOST_TEST_REQUIRE(s.error.empty(), s.error);
    BOOST_TEST(s.crossed, s.cross_why);
    BOOST_TEST(!not_on(s.ucx_ports, "127.0.0.1").empty(),
               "listening on 0.0.0.0, UCX's tcp listens on" << text(s.ucx_ports));
  }
  // The option off: ports_unconfined() (connected, bytes crossed) had more.
  BOOST_TEST(!not_on(ports_unconfined(), "127.0.0.1").empty());
}

// A NET_DEVICES setting in a ucx.conf stands as the environment's does.
// UCX reads its configuration files once, when it is loaded, so the check
// runs in this binary run again (the case below, disabled in a plain run)
// with UCX_CONFIG_DIR naming a directory whose ucx.conf sets
// UCX_NET_DEVICES to every device UCX's tcp uses here, by name (a value
// other than UCX's default "all", which a file cannot tell apart from no
// setting). Listening on 127.0.0.1 then leaves UCX's tcp on every one of
// them; confined, it would be on 127.0.0.1 only.
BOOST_AUTO_TEST_CASE(ucx_conf_devices_in_a_process_of_its_own, *boost::unit_test::disabled()) {
  const char* dir = std::getenv("UCX_CONFIG_DIR");
  const char* expected = std::getenv("BLOBPIPE_EXPECTED_NET_DEVICES");
  BOOST_TEST_REQUIRE(dir != nullptr, "run by a_net_devices_setting_in_a_ucx_conf_stands only");
  BOOST_TEST_REQUIRE(expected != nullptr);
  ::unsetenv("UCX_NET_DEVICES");
  BOOST_TEST(ucx::detail::configured_net_devices() == expected);
  const auto s = listen_connect_look("127.0.0.1", "127.0.0.1", tcp_link().opt);
  BOOST_TEST_REQUIRE(s.error.empty(), s.error);
  BOOST_TEST(s.crossed, s.cross_why);
  BOOST_TEST(!not_on(s.ucx_ports, "127.0.0.1").empty(),
             "UCX_NET_DEVICES=" << expected << " in " << dir
                                << "/ucx.conf, UCX's tcp listens on" << text(s.ucx_ports));
}

BOOST_AUTO_TEST_CASE(a_net_devices_setting_in_a_ucx_conf_stands) {
  SKIP_UNLESS_UCX_TCP_LISTENS_BEYOND_LO();
  std::string devices;
  for (const auto& d : ucx::detail::tl_devices())
    if (d.net && d.tl == "tcp") devices += (devices.empty() ? "" : ",") + d.dev;
  BOOST_TEST_REQUIRE(devices.find(',') != std::string::npos, devices);
  // Without a file, and with the variable unset, UCX's default; a host
  // whose own ucx.conf (or an inherited UCX_CONFIG_DIR) names devices
  // already would show nothing here.
  ::unsetenv("UCX_NET_DEVICES");
  if (const std::string here = ucx::detail::configured_net_devices(); here != "all")
    BLOBPIPE_SKIP("this host's UCX configuration already sets NET_DEVICES (" << here << ")");
  const std::filesystem::path dir = scratch_dir() / "ucx_conf";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "ucx.conf") << "UCX_NET_DEVICES=" << devices << "\n";
  const run_result r =
      run_process("/proc/self/exe", {"--run_test=ucx_conf_devices_in_a_process_of_its_own"},
                  std::nullopt,
                  {"UCX_CONFIG_DIR=" + dir.string(), "BLOBPIPE_EXPECTED_NET_DEVICES=" + devices});
  BOOST_TEST(r.exit_code == 0, "the child exited " << r.exit_code << ":\n" << r.out << r.err);
}

// One UCX context per io_context, confined by its first listen: a later
// listener on another interface (or on every one) could be reached, UCX's
// tcp behind it could not, so it is refused, saying why.
BOOST_AUTO_TEST_CASE(a_later_listener_on_another_interface_of_a_confined_io_context_is_refused) {
  SKIP_UNLESS_UCX_TCP_LISTENS_BEYOND_LO();
  const std::string addr = other_interface_address();
  {
    asio::io_context ctx;
    auto first = ucx::listen(ctx.get_executor(), 0, "127.0.0.1", tcp_link().opt);
    BOOST_TEST_REQUIRE(first.has_value(), first.message());
    auto other = ucx::listen(ctx.get_executor(), 0, addr, tcp_link().opt);
    BOOST_TEST((other.code() == errc::invalid_argument), other.message());
    BOOST_TEST(other.message().find("confined to lo") != std::string::npos, other.message());
    auto any = ucx::listen(ctx.get_executor(), 0, "0.0.0.0", tcp_link().opt);
    BOOST_TEST((any.code() == errc::invalid_argument), any.message());
    auto same = ucx::listen(ctx.get_executor(), 0, "127.0.0.1", tcp_link().opt);
    BOOST_TEST(same.has_value(), same.message());
  }
  {
    // Created unconfined, the context serves listeners anywhere.
    asio::io_context ctx;
    auto first = ucx::listen(ctx.get_executor(), 0, "127.0.0.1", unconfined());
    BOOST_TEST_REQUIRE(first.has_value(), first.message());
    auto other = ucx::listen(ctx.get_executor(), 0, addr, unconfined());
    BOOST_TEST(other.has_value(), other.message());
  }
}

// Confined to the loopback interface with no other network device (a
// first listen on 127.0.0.1, no RDMA port), an io_context's UCX reaches no
// other host: connect() to an address not on this host is refused at once
// with invalid_argument, before any TCP connect (toward 203.0.113.77,
// TEST-NET-3, the TCP connect would wait out handshake_timeout: timed_out),
// while this host's own addresses still connect.
BOOST_AUTO_TEST_CASE(a_loopback_only_io_context_refuses_to_connect_to_another_host) {
  BLOBPIPE_SKIP_UNLESS_OFFERED(tcp_link());
  ::unsetenv("UCX_NET_DEVICES");
  const std::string lo = ucx::detail::interface_of(asio::ip::make_address_v4("127.0.0.1"));
  const std::string value = ucx::detail::net_devices_confining_tcp(ucx::detail::tl_devices(), lo);
  if (value != lo)
    BLOBPIPE_SKIP("confined to " << lo << ", UCX keeps other network devices here ("
                                 << (value.empty() ? std::string("none: tcp does not use it")
                                                   : value)
                                 << "), so it may reach other hosts");
  runner r;
  std::error_code remote, local;
  auto body = [&]() -> asio::awaitable<void> {
    auto lis = ucx::listen(r.ex(), 0, "127.0.0.1", tcp_link().opt);
    if (!lis) co_return;
    ucx::options o = tcp_link().opt;
    o.handshake_timeout = std::chrono::seconds(3);
    auto [rec, ra] = co_await ucx::connect(r.ex(), "203.0.113.77", lis->port(), {}, o);
    remote = rec;
    auto [lec, la] = co_await ucx::connect(r.ex(), "127.0.0.1", lis->port(), {}, o);
    local = lec;
    if (la) la->close();
    lis->close();
  };
  r.spawn(body());
  BOOST_TEST_REQUIRE(r.run(std::chrono::seconds(30)));
  BOOST_TEST((remote == errc::invalid_argument), remote.message());
  BOOST_TEST(!local, local.message());
  // Confined to another interface (eth0 here), the connect is tried: what
  // routes through that interface may reach the host (here nothing
  // answers: peer_failed or timed_out, not a refusal).
  const std::string addr = other_interface_address();
  if (addr.empty()) {
    BOOST_TEST_MESSAGE("UCX's tcp listens on no interface but lo here: the other-interface half is not checked");
    return;
  }
  runner r2;
  std::error_code tried;
  auto other = [&]() -> asio::awaitable<void> {
    auto lis = ucx::listen(r2.ex(), 0, addr, tcp_link().opt);
    if (!lis) co_return;
    ucx::options o = tcp_link().opt;
    o.handshake_timeout = std::chrono::seconds(1);
    auto [ec, t] = co_await ucx::connect(r2.ex(), "203.0.113.77", lis->port(), {}, o);
    tried = ec;
    lis->close();
  };
  r2.spawn(other());
  BOOST_TEST_REQUIRE(r2.run(std::chrono::seconds(30)));
  BOOST_TEST((tried && tried != errc::invalid_argument), tried.message());
}

// The value blobpipe gives UCX_NET_DEVICES, on device lists this machine
// does not have: every other transport's network devices stay, each once;
// shared memory, self and accelerator devices are not network devices and
// are left out (UCX_NET_DEVICES does not filter them); no tcp on the
// interface: nothing.
BOOST_AUTO_TEST_CASE(net_devices_keep_every_other_transports_network_devices) {
  using ucx::detail::net_devices_confining_tcp;
  using ucx::detail::tl_device;
  const std::vector<tl_device> rdma_host = {
      {"posix", "memory", false},      {"self", "memory0", false},
      {"tcp", "eth0", true},           {"tcp", "ib0", true},
      {"tcp", "lo", true},             {"rc_verbs", "mlx5_0:1", true},
      {"rc_mlx5", "mlx5_0:1", true},   {"ud_mlx5", "mlx5_1:1", true},
      {"cuda_copy", "cuda", false},
  };
  BOOST_TEST(net_devices_confining_tcp(rdma_host, "eth0") == "mlx5_0:1,mlx5_1:1,eth0");
  BOOST_TEST(net_devices_confining_tcp(rdma_host, "lo") == "mlx5_0:1,mlx5_1:1,lo");
  // tcp does not use that interface: nothing to confine.
  BOOST_TEST(net_devices_confining_tcp(rdma_host, "eth1") == "");
  const std::vector<tl_device> no_tcp = {{"rc_mlx5", "mlx5_0:1", true}};
  BOOST_TEST(net_devices_confining_tcp(no_tcp, "eth0") == "");
  const std::vector<tl_device> tcp_only = {{"tcp", "eth0", true}, {"tcp", "lo", true}};
  BOOST_TEST(net_devices_confining_tcp(tcp_only, "lo") == "lo");
}

// The interface of an address, as UCX names it.
BOOST_AUTO_TEST_CASE(interface_of_finds_the_loopback_interface) {
  using ucx::detail::interface_of;
  const std::string lo = interface_of(asio::ip::make_address_v4("127.0.0.1"));
  BOOST_TEST(!lo.empty());
  // A loopback address no interface lists itself is the loopback's too.
  BOOST_TEST(interface_of(asio::ip::make_address_v4("127.0.0.2")) == lo);
  // TEST-NET-3: on no interface here.
  BOOST_TEST(interface_of(asio::ip::make_address_v4("203.0.113.77")) == "");
  // UCX's tcp lists that interface (it does, for lo, when tcp is offered).
  bool tcp_has_it = false;
  for (const auto& d : ucx::detail::tl_devices())
    if (d.tl == "tcp" && d.dev == lo && d.net) tcp_has_it = true;
  if (ucx_transports_here().count("tcp")) BOOST_TEST(tcp_has_it, lo);
}
