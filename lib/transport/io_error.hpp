// Maps Asio/OS errors of a connection onto blobpipe's vocabulary.
#pragma once

#include <system_error>

namespace blobpipe::detail {

/// closed when this side closed the object (whatever the OS said), else:
/// eof, broken pipe -> peer_closed; everything else (reset, unreachable,
/// aborted by a cancellation) -> peer_failed.
std::error_code map_io_error(std::error_code ec, bool closed_by_us) noexcept;

}  // namespace blobpipe::detail
