// blobpipe/version.hpp — the library's version.
//
//   std::cout << blobpipe::version();   // "MAJOR.MINOR.PATCH"
#pragma once

namespace blobpipe {

/// The version of the blobpipe library linked in, "MAJOR.MINOR.PATCH"
/// (version.bzl at the repository root, the one place it is written; the
/// CLI's --version, the Python package's __version__, blobpipe.pc and the
/// CMake package config give the same).
const char* version() noexcept;

}  // namespace blobpipe
