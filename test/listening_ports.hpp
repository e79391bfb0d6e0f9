// test/listening_ports.hpp — the TCP ports a process listens on, with their
// addresses, read from /proc (no ss, no netlink): the LISTEN rows of
// /proc/<pid>/net/tcp and tcp6 whose socket inode is one of the process's
// open files (/proc/<pid>/fd links "socket:[inode]"). For the UCX tests
// that look at UCX's own tcp transport ports (docs/ucx.md "Foreign bytes").
//
//   for (const auto& [host, port] : listening_ports(::getpid())) ...
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace blobpipe::testing {

/// The TCP ports process `pid` listens on: (address as text, port). IPv4
/// rows first ("127.0.0.1"), then IPv6 ones ("::1", "::" for any).
inline std::vector<std::pair<std::string, std::uint16_t>> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(fd_dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      char target[256];
      const std::string link = fd_dir + "/" + e->d_name;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      const std::string t(target, static_cast<std::size_t>(n));
      if (t.starts_with("socket:[")) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(d);
  }
  std::vector<std::pair<std::string, std::uint16_t>> out;
  for (const bool v6 : {false, true}) {
    std::ifstream tcp("/proc/" + std::to_string(pid) + (v6 ? "/net/tcp6" : "/net/tcp"));
    std::string line;
    std::getline(tcp, line);  // header
    while (std::getline(tcp, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;
      // local: the address as 32-bit words of hex digits, each the word's
      // bytes in host order (8 digits for IPv4, 32 for IPv6), ':', port.
      const std::size_t colon = local.find(':');
      if (colon == std::string::npos) continue;
      const auto port = static_cast<std::uint16_t>(std::stoul(local.substr(colon + 1), nullptr, 16));
      unsigned char raw[16] = {};
      const std::size_t words = colon / 8;
      for (std::size_t w = 0; w < words && w < 4; ++w) {
        const auto word = static_cast<std::uint32_t>(std::stoul(local.substr(w * 8, 8), nullptr, 16));
        std::memcpy(raw + 4 * w, &word, 4);
      }
      char text[INET6_ADDRSTRLEN] = {};
      if (::inet_ntop(v6 ? AF_INET6 : AF_INET, raw, text, sizeof text) == nullptr) continue;
      out.emplace_back(text, port);
    }
  }
  return out;
}

}  // namespace blobpipe::testing
