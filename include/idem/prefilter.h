// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// DuplicateFilter: an optional fast check in front of the Inbox that sheds
// most duplicates before the database is touched (idem::redis::Prefilter
// keeps it in Redis). It is never the only guard: it remembers a message only
// after its marker committed, and anything it does not know (or cannot reach)
// goes to the store, whose marker decides. Losing the filter's data costs
// speed, never correctness.
//
// Thread safety: implementations must be safe to call from many threads.
#ifndef IDEM_PREFILTER_H_
#define IDEM_PREFILTER_H_

#include <span>
#include <string_view>
#include <vector>

#include "idem/message.h"

namespace idem {

class DuplicateFilter {
 public:
  virtual ~DuplicateFilter() = default;
  // For each id: true when the filter knows (consumer, id) was committed with
  // this fingerprint. Errors and unknown ids answer false.
  virtual std::vector<bool> KnownApplied(std::string_view consumer, std::span<const Message> messages) = 0;
  // Called after the markers of `messages` are known committed. Best effort:
  // errors are ignored.
  virtual void Remember(std::string_view consumer, std::span<const Message> messages) = 0;
};

}  // namespace idem

#endif  // IDEM_PREFILTER_H_
