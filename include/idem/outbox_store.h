// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The contract a store implements to hold an outbox (idem/outbox.h) and
// serve its relays (idem/outbox_relay.h). Users need only those two
// headers; this one is for store implementers and tools.
//
// Order: rows with one ordering key get increasing seq in the order their
// transactions commit; the store writes them so (one writer on SQLite, a
// lock per key until commit on PostgreSQL).
//
// Work sharing: the store splits rows into lanes (by ordering key, or id
// when the key is empty); a relay session publishes only the lanes it
// holds, and a lane is held by one session at a time, released when that
// session's process ends (however it ends).
//
// Thread safety: an OutboxStore is safe from many threads; a session
// belongs to one thread.
#ifndef IDEM_OUTBOX_STORE_H_
#define IDEM_OUTBOX_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem {

// Headers every relayed message carries besides the producer time and the
// ordering key (idem/publisher.h; doc/wire-format.md).
inline constexpr std::string_view kOutboxSeqHeader = "idem-outbox-seq";
inline constexpr std::string_view kCausationIdHeader = "idem-causation-id";

// An outgoing message as stored.
struct OutboxRow {
  int64_t seq = 0;  // set by the store: increasing per key in commit order
  std::string id{};
  std::string destination{};
  std::string key{};
  std::string payload{};
  std::vector<std::pair<std::string, std::string>> headers{};
  int64_t producer_time_ms = 0;
  int64_t added_at_ms = 0;
  int attempts = 0;  // transient publish failures so far
};

struct OutboxDeadLetter {
  OutboxRow row{};
  std::string reason{};  // "refused" (the broker refused it for good) or "failed" (max_attempts)
  std::string error{};
  int64_t at_ms = 0;
};

struct OutboxStats {
  int64_t backlog = 0;                        // committed, not yet confirmed by a broker
  std::optional<int64_t> oldest_unsent_ms{};  // added_at_ms of the oldest of them
  int64_t dead_letters = 0;
  int64_t sent_kept = 0;  // confirmed, kept for retention
  int64_t relays = 0;     // relays seen in the last minute
};

// What one relay round settles, written in one transaction.
struct OutboxSettlement {
  std::vector<int64_t> sent{};                            // confirmed: seq
  std::vector<OutboxDeadLetter> dead{};                   // refused for good / failed too often
  std::vector<std::pair<int64_t, std::string>> failed{};  // transient: seq, error (attempts + 1)
  bool keep_sent = true;                                  // move sent rows to retention, or delete
  int64_t now_ms = 0;
};

// One relay's connection to the outbox.
class OutboxSession {
 public:
  virtual ~OutboxSession() = default;
  // Heartbeats and takes (or gives back) lanes toward a fair share among the
  // live sessions. Returns how many lanes this session holds (0: standby).
  virtual Result<int> Rebalance() = 0;
  // Unsettled rows of the lanes held, lowest seq first, at most `limit`.
  // Rows of one key come in seq order. `republished` counts the rows a
  // session (this or an earlier one) may have handed to a broker already.
  virtual Result<std::vector<OutboxRow>> Fetch(int limit, int64_t* republished) = 0;
  // Records that rows up to `max_seq` are about to be handed to a broker (a
  // hint for the republished count; not durable).
  virtual Status NoteHanded(std::span<const OutboxRow> rows) = 0;
  virtual Status Settle(const OutboxSettlement& settlement) = 0;
  // Blocks until rows may have been added (a commit that added some, here or
  // in another process) or `timeout_ms` passed.
  virtual Status Wait(int64_t timeout_ms) = 0;
  // False once the session has lost its connection or its lanes: publish
  // nothing more; open a new session.
  virtual bool Alive() = 0;
};

class OutboxStore {
 public:
  virtual ~OutboxStore() = default;
  virtual Result<std::unique_ptr<OutboxSession>> OpenSession(std::string_view name) = 0;
  virtual Result<OutboxStats> Stats() = 0;
  // Whether any message is waiting (in any lane): Stats().backlog > 0,
  // without counting everything Stats counts.
  virtual Result<bool> HasUnsent() {
    IDEM_ASSIGN_OR_RETURN(OutboxStats st, Stats());
    return st.backlog > 0;
  }
  virtual Result<std::vector<OutboxDeadLetter>> ListDeadLetters(int limit) = 0;
  virtual Result<int64_t> PurgeOutbox(int64_t sent_before_ms, int64_t dead_before_ms, int batch_size) = 0;
};

}  // namespace idem

#endif  // IDEM_OUTBOX_STORE_H_
