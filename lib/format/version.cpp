// blobpipe::version(): BLOBPIPE_VERSION (bare, as 1.2.3) comes from
// //:version.bzl through this package's BUILD.bazel.
#include "blobpipe/version.hpp"

#define BLOBPIPE_STRING(x) #x
#define BLOBPIPE_EXPANDED_STRING(x) BLOBPIPE_STRING(x)

namespace blobpipe {

const char* version() noexcept { return BLOBPIPE_EXPANDED_STRING(BLOBPIPE_VERSION); }

}  // namespace blobpipe
