// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// FakeDownstream: a stand-in for the service a handler calls and no
// transaction covers (a payment provider, another team's API), for tests.
// It behaves as a provider that honours idempotency keys does: the first
// call with a key does the work (an "effect") and answers; a later call with
// the same key and request answers the same again and does nothing. A call
// with no key does the work every time. Every call is recorded, with its key.
//
//   idem::testing::FakeDownstream provider("/tmp/run/downstream.db");
//   auto charge = provider.Call(key, "charge alice 4000");  // "ds-1f0c..." (a receipt)
//   provider.Effects();   // what was done, one entry per effect
//
// The record is a SQLite file, so every process of a test (a child killed
// at a crash point, a second consumer process) sees the same service.
//
// Faults, for the harness (idem/testing/harness.h) and tests of your own:
// lose the answer of the n-th call (the work is done, the caller gets
// kUnavailable, as a timeout or a reset connection would give), or kill the
// calling process after the n-th call's work (SIGKILL), or run a hook after
// the work and before the answer (another delivery, a clock jump).
//
// Thread safety: safe from many threads and processes (each process opens
// the file for itself).
#ifndef IDEM_TESTING_DOWNSTREAM_H_
#define IDEM_TESTING_DOWNSTREAM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/result.h"
#include "idem/status.h"

namespace idem::testing {

class FakeDownstream {
 public:
  struct Record {
    std::string key{};  // "" when the caller sent none
    std::string request{};
    std::string response{};
    bool effect = false;  // this call did the work (not a replay)
  };
  // The fault for calls from now on, counted from 1 in this process.
  struct Fault {
    enum class Kind { kNone, kLoseResponse, kKillAfterWork };
    Kind kind = Kind::kNone;
    int64_t at = 1;  // the at-th call after Arm
  };

  // `path`: the SQLite file of the record (created when missing).
  explicit FakeDownstream(std::string path);
  ~FakeDownstream();
  FakeDownstream(const FakeDownstream&) = delete;
  FakeDownstream& operator=(const FakeDownstream&) = delete;

  // The call: the receipt ("ds-" and 16 hex digits, the same for the same
  // key, or for the same request and its count when there is no key). A
  // known key with another request is refused (kConflict), as providers do.
  // kUnavailable when the answer is lost (Fault) or the record fails.
  Result<std::string> Call(std::string_view key, std::string_view request);

  void Arm(Fault fault);
  // Runs `hook` once, after the work of the next call that does work and
  // before its answer (the harness starts another delivery there).
  void OnNextEffect(std::function<void()> hook);

  // Every call so far, in order (from every process).
  Result<std::vector<Record>> Calls();
  // The work done: "<request> key=<key>" (or "key=none"), one per effect.
  Result<std::vector<std::string>> Effects();
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  std::string path_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTING_DOWNSTREAM_H_
