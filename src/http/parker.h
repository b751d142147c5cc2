// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: how a request waits for its group's decision under group commit
// (Idempotency::Options::group_commit_max). On a plain thread it blocks. A
// server that runs requests as fibers (idem::httplib::Server::set_fibers)
// installs a lookup that gives the running fiber's Parker, so the wait gives
// the thread up to the other connections instead. The core knows no fibers.
#ifndef IDEM_SRC_HTTP_PARKER_H_
#define IDEM_SRC_HTTP_PARKER_H_

namespace idem::http::internal {

class Parker {
 public:
  virtual ~Parker() = default;
  // Gives the thread up until Unpark() (which may come first: then it
  // returns at once). Called by the parked request's own fiber.
  virtual void Park() = 0;
  // Resumes the parked request. From any thread.
  virtual void Unpark() = 0;
};

// The Parker of the fiber running on this thread, or null (a plain thread).
using ParkerLookup = Parker* (*)();
Parker* CurrentParker();
// Installs the lookup (once, by the fiber loops; thread-safe).
void SetParkerLookup(ParkerLookup lookup);

}  // namespace idem::http::internal

#endif  // IDEM_SRC_HTTP_PARKER_H_
