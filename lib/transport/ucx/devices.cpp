#include "lib/transport/ucx/devices.hpp"

#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

namespace blobpipe::ucx::detail {

namespace {

// UCT's lists and handles, released however the enumeration ends.
struct component_list_free {
  void operator()(uct_component_h* p) const noexcept { uct_release_component_list(p); }
};
struct md_config_free {
  void operator()(uct_md_config_t* p) const noexcept { uct_config_release(p); }
};
struct md_close {
  void operator()(uct_md* p) const noexcept { uct_md_close(p); }
};
struct tl_list_free {
  void operator()(uct_tl_resource_desc_t* p) const noexcept { uct_release_tl_resource_list(p); }
};
struct ifaddrs_free {
  void operator()(ifaddrs* p) const noexcept { freeifaddrs(p); }
};
struct ucp_config_free {
  void operator()(ucp_config_t* p) const noexcept { ucp_config_release(p); }
};
struct malloc_free {
  void operator()(char* p) const noexcept { std::free(p); }
};

// The transport resources of one memory domain of `comp`.
void add_md_devices(uct_component_h comp, const char* md_name, std::vector<tl_device>& out) {
  uct_md_config_t* raw_cfg = nullptr;
  if (uct_md_config_read(comp, nullptr, nullptr, &raw_cfg) != UCS_OK) return;
  std::unique_ptr<uct_md_config_t, md_config_free> cfg(raw_cfg);
  uct_md_h raw_md = nullptr;
  if (uct_md_open(comp, md_name, cfg.get(), &raw_md) != UCS_OK) return;
  std::unique_ptr<uct_md, md_close> md(raw_md);
  uct_tl_resource_desc_t* raw_tls = nullptr;
  unsigned n = 0;
  if (uct_md_query_tl_resources(md.get(), &raw_tls, &n) != UCS_OK) return;
  std::unique_ptr<uct_tl_resource_desc_t, tl_list_free> tls(raw_tls);
  for (unsigned i = 0; i < n; ++i)
    out.push_back({raw_tls[i].tl_name, raw_tls[i].dev_name,
                   raw_tls[i].dev_type == UCT_DEVICE_TYPE_NET});
}

}  // namespace

std::vector<tl_device> tl_devices() {
  std::vector<tl_device> out;
  uct_component_h* raw_comps = nullptr;
  unsigned ncomps = 0;
  if (uct_query_components(&raw_comps, &ncomps) != UCS_OK) return out;
  std::unique_ptr<uct_component_h, component_list_free> comps(raw_comps);
  for (unsigned c = 0; c < ncomps; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(raw_comps[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(raw_comps[c], &attr) != UCS_OK) continue;
    for (const auto& md : mds) add_md_devices(raw_comps[c], md.md_name, out);
  }
  return out;
}

std::string configured_net_devices() {
  ucp_config_t* raw_cfg = nullptr;
  if (ucp_config_read(nullptr, nullptr, &raw_cfg) != UCS_OK) return {};
  std::unique_ptr<ucp_config_t, ucp_config_free> cfg(raw_cfg);
  char* raw_text = nullptr;
  std::size_t size = 0;
  FILE* f = open_memstream(&raw_text, &size);
  if (f == nullptr) return {};
  ucp_config_print(cfg.get(), f, nullptr, UCS_CONFIG_PRINT_CONFIG);
  std::fclose(f);
  std::unique_ptr<char, malloc_free> text(raw_text);
  // One "NAME=value" line per setting.
  constexpr std::string_view key = "UCX_NET_DEVICES=";
  std::string_view all(text.get(), size);
  for (std::size_t at = 0; at < all.size();) {
    const std::size_t end = std::min(all.find('\n', at), all.size());
    const std::string_view line = all.substr(at, end - at);
    if (line.starts_with(key)) return std::string(line.substr(key.size()));
    at = end + 1;
  }
  return {};
}

std::string interface_of(const asio::ip::address_v4& addr) {
  ifaddrs* raw = nullptr;
  if (getifaddrs(&raw) != 0) return {};
  std::unique_ptr<ifaddrs, ifaddrs_free> list(raw);
  const auto want = addr.to_uint();
  std::string loopback;
  for (const ifaddrs* i = raw; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || i->ifa_name == nullptr)
      continue;
    std::string name = i->ifa_name;
    name.resize(std::min(name.find(':'), name.size()));  // "eth0:1" -> "eth0"
    sockaddr_in sin{};
    std::memcpy(&sin, i->ifa_addr, sizeof sin);
    if (ntohl(sin.sin_addr.s_addr) == want) return name;
    if ((i->ifa_flags & IFF_LOOPBACK) != 0 && loopback.empty()) loopback = name;
  }
  return addr.is_loopback() ? loopback : std::string{};
}

std::string net_devices_confining_tcp(const std::vector<tl_device>& all, const std::string& iface) {
  const bool tcp_has_it = std::any_of(all.begin(), all.end(), [&](const tl_device& d) {
    return d.net && d.tl == "tcp" && d.dev == iface;
  });
  if (!tcp_has_it) return {};
  std::vector<std::string> devs;
  for (const auto& d : all)
    if (d.net && d.tl != "tcp" && d.dev != iface &&
        std::find(devs.begin(), devs.end(), d.dev) == devs.end())
      devs.push_back(d.dev);
  devs.push_back(iface);
  std::string value;
  for (const auto& d : devs) value += (value.empty() ? "" : ",") + d;
  return value;
}

}  // namespace blobpipe::ucx::detail
