// blobpipe/protocol/delivered_tags.hpp — what a consumer_session asks to
// decide that a resent blob is a duplicate (docs/wire.md "Delivery").
// blobpipe::delivery_log (blobpipe/pipeline/delivery.hpp) is the library's
// log; the protocol layer knows only this interface.
#pragma once

#include "blobpipe/format/footer.hpp"
#include "blobpipe/protocol/wire.hpp"

namespace blobpipe {

/// The tags of blobs a consumer delivered, per resend session
/// (blobpipe::delivery_log is the one the library uses; docs/wire.md
/// "Delivery"). May be shared by sessions on several threads.
class delivered_tags {
 public:
  virtual ~delivered_tags() = default;
  /// True when `tag` was recorded for `session` and is still remembered.
  virtual bool contains(const session_id& session, const tag_t& tag) const = 0;
  /// Records `tag` as delivered for `session`.
  virtual void record(const session_id& session, const tag_t& tag) = 0;
};

}  // namespace blobpipe
