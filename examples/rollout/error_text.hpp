// examples/rollout/error_text.hpp — an error code as the examples print it.
//
// A blobpipe code's message() only spells out its name ("peer_failed" /
// "peer failed"), so printing both says the same thing twice. The
// examples print the name once, and after it the reason when there is one
// that says more (an event's reason, a blob_writer's last_error, what the
// example itself knows about the step):
//
//   error_text(ec)                       // "peer_failed"
//   error_text(ev.error, ev.reason)      // "peer_closed: no bytes from the sender for 5 s"
#pragma once

#include <string>
#include <string_view>
#include <system_error>

#include "blobpipe/errors.hpp"

namespace rollout {

/// The code's stable name (errc_name; the message for a code of another
/// category), then ": reason" unless `reason` is empty or only the code's
/// own message. The reason is escaped (blobpipe::escape): control
/// characters cannot forge a line or move the cursor.
inline std::string error_text(std::error_code ec, std::string_view reason = {}) {
  std::string s = ec.category() == blobpipe::category() ? blobpipe::errc_name(ec) : ec.message();
  if (!reason.empty() && reason != ec.message()) {
    s += ": ";
    s += blobpipe::escape(reason);  // often a peer's words: escaped, one line
  }
  return s;
}

}  // namespace rollout
