// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Shared test helpers: temporary directories, a payments handler, and the
// rule that every test delivers every message at least twice.
#ifndef IDEM_TEST_UTIL_TEST_UTIL_H_
#define IDEM_TEST_UTIL_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/inbox.h"
#include "idem/message.h"
#include "idem/source.h"
#include "idem/sqlite/store.h"
#include "idem/store.h"
#include "idem/store_backend.h"
#include "idem/testing/gtest.h"
#include "idem/testing/harness.h"
#include "util/temp_dir.h"

namespace idem::testing {

// Receives from `src` until `n` deliveries arrived or `within_s` seconds
// passed (an upper bound, never a pass condition); a failed Receive fails
// the test and ends the wait.
inline std::vector<Delivery> ReceiveUntil(Source& src, size_t n, int within_s = 60) {
  std::vector<Delivery> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(within_s);
  while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
    auto got = src.Receive(static_cast<int>(n - out.size()), 200);
    EXPECT_OK(got);
    if (!got.ok()) break;
    for (Delivery& d : *got) out.push_back(std::move(d));
  }
  return out;
}

// What T::Open(args...) opens (Claims, Inbox, ...), or a failed test: the
// test stops here, loudly.
template <typename T, typename... Args>
std::unique_ptr<T> MustOpen(Args&&... args) {
  auto r = T::Open(std::forward<Args>(args)...);
  if (!r.ok()) {
    ADD_FAILURE() << "opening failed: " << r.status();
    std::abort();
  }
  return std::move(*r);
}

// The test kit's Msg(id, payload) (idem/testing/harness.h), and this one:
// a message whose payload is "payload-of-<id>".
inline Message Msg(std::string id) {
  std::string payload = "payload-of-" + id;
  return Msg(std::move(id), std::move(payload));
}

// The business table of the payments example: one row per charge, no unique
// key of its own, so a repeated effect shows up as a second row.
inline Status CreatePayments(Store& store) {
  auto tx = store.Begin();
  if (!tx.ok()) return tx.status();
  IDEM_RETURN_IF_ERROR(
      (*tx)->Exec("CREATE TABLE IF NOT EXISTS payments(message_id TEXT NOT NULL, cents INTEGER NOT NULL)").status());
  return (*tx)->Commit();
}

// Inserts one payments row for the message; the amount is the payload parsed
// as an integer (or 4000).
inline Handler ChargeHandler() {
  return [](Transaction& tx, const Message& m) -> Status {
    int64_t cents = std::atoll(m.payload.c_str());
    if (cents <= 0) cents = 4000;
    return tx.Exec("INSERT INTO payments(message_id, cents) VALUES ($1, $2)", {m.id, cents}).status();
  };
}

// Number of payments rows for `id` ("" for all rows).
inline int64_t Charges(Store& store, const std::string& id = "") {
  auto tx = store.Begin();
  EXPECT_OK(tx);
  if (!tx.ok()) return -1;
  auto rows = id.empty() ? (*tx)->Query("SELECT count(*) FROM payments")
                         : (*tx)->Query("SELECT count(*) FROM payments WHERE message_id = $1", {id});
  EXPECT_OK(rows);
  return rows.ok() ? rows->rows[0][0].AsInt() : -1;
}

// Runs `body` in a forked child and returns its wait status. The child exits
// with body()'s return value.
inline int RunInChild(const std::function<int()>& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int rc = body();
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// A Store that forwards every call to another: derive from it to watch or
// hook one call.
class ForwardingStore : public Store {
 public:
  explicit ForwardingStore(Store& inner) : inner_(inner) {}
  Result<std::unique_ptr<StoreTransaction>> Begin() override { return inner_.Begin(); }
  Result<std::optional<Marker>> FindMarker(std::string_view c, std::string_view id,
                                           std::optional<int64_t> produced_at_ms = std::nullopt) override {
    return inner_.FindMarker(c, id, produced_at_ms);
  }
  Result<FailureCount> RecordFailure(const FailureRecord& f) override { return inner_.RecordFailure(f); }
  Status ClearFailures(std::string_view c, std::string_view id) override { return inner_.ClearFailures(c, id); }
  Result<int64_t> Purge(std::string_view c, int64_t before_ms, int batch) override {
    return inner_.Purge(c, before_ms, batch);
  }
  Result<int64_t> CountMarkers(std::string_view c) override { return inner_.CountMarkers(c); }
  Result<std::vector<Marker>> ListMarkers(std::string_view c, int limit) override {
    return inner_.ListMarkers(c, limit);
  }
  Result<std::vector<DeadLetter>> ListDeadLetters(std::string_view c, int limit) override {
    return inner_.ListDeadLetters(c, limit);
  }
  Result<SchemaInfo> Schema() override { return inner_.Schema(); }
  std::string_view Kind() const override { return inner_.Kind(); }
  ClaimStore* claim_store() override { return inner_.claim_store(); }

 protected:
  Store& inner_;
};

// Polls `cond` every 10 ms until it holds or `timeout_ms` passed (generous
// by default: a loaded machine is slow, never wrong); says whether it held.
inline bool WaitFor(const std::function<bool()>& cond, int64_t timeout_ms = 90'000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_TEST_UTIL_H_
