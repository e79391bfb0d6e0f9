// test/golden_dir.hpp — finds the golden blobs (shared/golden) for tests.
//
// The golden cases live outside the repository, beside the clone:
//   <workspace>/../shared/golden/manifest.json
// Lookup order:
//   1. $BLOBPIPE_GOLDEN_DIR when set and non-empty (CI's wrapper exports an
//      absolute path; .bazelrc passes it through). Used alone: a wrong
//      explicit path is an error, not a reason to guess.
//   2. $BUILD_WORKSPACE_DIRECTORY/../shared/golden (under `bazel run`).
//   3. The workspace root found by resolving this header's runfiles symlink
//      back to the source tree (under `bazel test`, whose working directory
//      is the runfiles tree), then ../shared/golden.
//   4. ./../shared/golden (a test binary run by hand from the repo root).
// Link `//test:golden_dir` (it ships this header as runfile data) and fail
// the test when nothing is found:
//
//   auto g = blobpipe::testing::find_golden_dir();
//   BOOST_TEST_REQUIRE(g.dir.has_value(), g.tried);
#pragma once

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>

namespace blobpipe::testing {

struct golden_lookup {
  std::optional<std::filesystem::path> dir;  ///< holds manifest.json
  std::string tried;  ///< every candidate looked at, for the failure message
};

/// The runfiles root of the running test ($TEST_SRCDIR/$TEST_WORKSPACE),
/// or the working directory outside `bazel test`.
inline std::filesystem::path runfiles_root() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  if (srcdir && *srcdir && ws && *ws) return std::filesystem::path(srcdir) / ws;
  return std::filesystem::current_path();
}

inline golden_lookup find_golden_dir() {
  namespace fs = std::filesystem;
  golden_lookup out;
  auto try_dir = [&out](const fs::path& dir, const char* why) {
    std::error_code ec;
    out.tried += std::string(out.tried.empty() ? "" : "; ") + why + ": " + dir.string();
    if (fs::is_regular_file(dir / "manifest.json", ec)) {
      out.dir = fs::weakly_canonical(dir, ec);
      if (ec) out.dir = dir;
      return true;
    }
    return false;
  };

  if (const char* env = std::getenv("BLOBPIPE_GOLDEN_DIR"); env && *env) {
    try_dir(env, "$BLOBPIPE_GOLDEN_DIR");
    return out;
  }
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY"); ws && *ws) {
    if (try_dir(fs::path(ws) / ".." / "shared" / "golden", "$BUILD_WORKSPACE_DIRECTORY"))
      return out;
  }
  {
    // A runfile is a symlink into the source tree: <ws>/test/golden_dir.hpp.
    std::error_code ec;
    fs::path anchor = runfiles_root() / "test" / "golden_dir.hpp";
    fs::path real = fs::canonical(anchor, ec);
    if (!ec) {
      fs::path ws = real.parent_path().parent_path();
      if (try_dir(ws / ".." / "shared" / "golden", "runfile symlink")) return out;
    } else {
      out.tried += std::string(out.tried.empty() ? "" : "; ") + "runfile " +
                   anchor.string() + ": " + ec.message();
    }
  }
  try_dir(fs::current_path() / ".." / "shared" / "golden", "working directory");
  return out;
}

}  // namespace blobpipe::testing
