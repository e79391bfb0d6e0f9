// tools/user_path.cpp — see user_path.hpp.
#include "tools/user_path.hpp"

#include <cstdlib>
#include <filesystem>

namespace blobpipe::cli {

std::string user_path(const std::string& p) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (!cwd || !*cwd || p.empty() || std::filesystem::path(p).is_absolute()) return p;
  return (std::filesystem::path(cwd) / p).string();
}

}  // namespace blobpipe::cli
