// tools/user_path.hpp — a path from the command line, as the user meant it.
//
// `bazel run` starts a program in its runfiles tree, not where the user
// typed the command; Bazel says where that was in BUILD_WORKING_DIRECTORY.
// blobpipe and the examples resolve relative paths against it:
//
//   auto f = blobpipe::cli::user_path(o.file);  // open f, print o.file
#pragma once

#include <string>

namespace blobpipe::cli {

/// `p` made relative to $BUILD_WORKING_DIRECTORY when that is set (under
/// `bazel run`) and `p` is relative; otherwise `p` unchanged (relative to
/// the working directory, as usual).
std::string user_path(const std::string& p);

}  // namespace blobpipe::cli
