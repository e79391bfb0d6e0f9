// Confining UCX's own tcp transport to the rendezvous's interface
// (docs/ucx.md "Foreign bytes").
//
// With tcp in UCX_TLS, a UCX worker listens on a port of its own on every
// network interface UCX's tcp transport finds (each bound to that
// interface's address: uct/tcp/tcp_iface.c), and UCX 1.13 aborts the
// process on 24 forged bytes sent there (tcp_ep.c:1404). When listen() is
// given one interface's address, blobpipe creates the io_context's UCX
// context with UCX_NET_DEVICES naming that interface and, unchanged, every
// network device of UCX's other transports (RDMA ones: mlx5_0:1 ...), so
// only tcp loses devices. UCX_NET_DEVICES filters network devices only;
// shared memory, self and accelerators have their own settings.
//
//   auto value = net_devices_confining_tcp(tl_devices(), "eth0");
//   // "mlx5_0:1,eth0" on a host with one RDMA port; "eth0" on one without
//
// Source: UCX 1.13 uct/api/uct.h (uct_query_components ...
// uct_md_query_tl_resources), ucp/api/ucp.h (ucp_config_read,
// ucp_config_print), ucp_context.c (NET_DEVICES), getifaddrs(3).
#pragma once

#include <string>
#include <vector>

#include <asio/ip/address_v4.hpp>

namespace blobpipe::ucx::detail {

/// One transport resource UCT reports, as `ucx_info -d` lists them.
struct tl_device {
  std::string tl;    ///< transport name: "tcp", "rc_mlx5", "posix", ...
  std::string dev;   ///< device name: "eth0", "mlx5_0:1", "memory", ...
  bool net = false;  ///< a network device (UCT_DEVICE_TYPE_NET)
};

/// Every transport resource of every memory domain of every UCT component
/// (uct_query_components, uct_component_query, uct_md_open,
/// uct_md_query_tl_resources; each domain is closed again). A component or
/// domain that cannot be queried or opened is left out; empty when UCT
/// reports nothing.
std::vector<tl_device> tl_devices();

/// The network interface that owns IPv4 `addr` (getifaddrs; an alias
/// label such as "eth0:1" is given as "eth0", the name UCX uses). A
/// loopback address no interface lists itself (127.0.0.2) belongs to the
/// loopback interface. Empty when no interface has it (or getifaddrs
/// failed).
std::string interface_of(const asio::ip::address_v4& addr);

/// The NET_DEVICES value UCX reads for itself, without blobpipe's
/// overrides: from UCX_NET_DEVICES in the environment or from a ucx.conf
/// UCX reads (UCX_CONFIG_DIR's, the user's home directory's, its
/// installation's /etc/ucx); "all", UCX's default, when nobody set it
/// (ucp_config_read, then ucp_config_print of the UCX_NET_DEVICES line).
/// Empty when UCX's configuration cannot be read.
std::string configured_net_devices();

/// The UCX_NET_DEVICES value that leaves UCX's tcp transport `iface` only
/// and keeps every network device of every other transport: those
/// devices, each once, in UCT's order, then `iface`. Empty when tcp does
/// not list `iface` (no tcp here, or UCX does not use that interface):
/// then there is nothing to confine, and confining would leave tcp no
/// device at all.
std::string net_devices_confining_tcp(const std::vector<tl_device>& all, const std::string& iface);

}  // namespace blobpipe::ucx::detail
