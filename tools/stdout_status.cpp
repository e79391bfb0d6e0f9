// tools/stdout_status.cpp — see stdout_status.hpp.
#include "tools/stdout_status.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

namespace blobpipe::cli {

std::string write_error_text(int err) {
  return err ? std::string("write error: ") + std::strerror(err) : std::string("write error");
}

int finish_stdout(std::string_view prefix, int status, int failure) noexcept {
  // std::cout writes through stdio, so its flush is stdout's fflush: the
  // errno of a write that fails there (say ENOSPC) is the reason. A write
  // that failed earlier has left only its mark on the streams (no reason).
  errno = 0;
  std::cout.flush();
  int err = std::cout ? 0 : errno;
  bool failed = !std::cout;
  if (std::fflush(stdout) != 0) {
    failed = true;
    err = errno;
  }
  failed = failed || std::ferror(stdout) != 0;
  if (!failed || status != 0) return status;
  try {
    std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(prefix.size()), prefix.data(),
                 write_error_text(err).c_str());
  } catch (...) {
    std::fprintf(stderr, "%.*s: write error\n", static_cast<int>(prefix.size()), prefix.data());
  }
  return failure;
}

}  // namespace blobpipe::cli
