// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/inbox.h"

#include <exception>
#include <optional>
#include <string>
#include <unordered_set>

namespace idem {

std::string_view KindName(Outcome::Kind kind) {
  switch (kind) {
    case Outcome::Kind::kApplied: return "applied";
    case Outcome::Kind::kDuplicate: return "duplicate";
    case Outcome::Kind::kConflict: return "conflict";
    case Outcome::Kind::kFailed: return "failed";
  }
  return "unknown";
}

std::string Outcome::ToString() const {
  std::string s(KindName(kind));
  if (kind == Kind::kFailed) s += " (" + status.ToString() + ")";
  if (kind == Kind::kConflict)
    s += " (stored fingerprint " + ToHex(stored_fingerprint) + ", incoming " + ToHex(incoming_fingerprint) + ")";
  return s;
}

namespace {

Outcome Failed(Status s) {
  Outcome o;
  o.kind = Outcome::Kind::kFailed;
  o.status = std::move(s);
  return o;
}

// Runs the user's handler; an exception becomes kHandlerFailed, so the caller
// always gets to roll back before anything else happens.
Status RunHandler(const Handler& handler, Transaction& tx, const Message& m) {
  try {
    Status s = handler(tx, m);
    if (s.ok() || s.code() == Code::kHandlerFailed) return s;
    return Status(Code::kHandlerFailed, s.ToString());
  } catch (const std::exception& e) {
    return Status::HandlerFailed(std::string("handler threw: ") + e.what());
  } catch (...) {
    return Status::HandlerFailed("handler threw an exception that is not a std::exception");
  }
}

}  // namespace

Inbox::Inbox(Store& store, InboxOptions options) : store_(store), options_(std::move(options)) {
  if (options_.env == nullptr) options_.env = Env::Default();
}

Outcome Inbox::Handle(const Message& message, const Handler& handler) {
  return HandleBatch(std::span<const Message>(&message, 1), handler).front();
}

std::vector<Outcome> Inbox::HandleBatch(std::span<const Message> messages, const Handler& handler) {
  std::vector<Outcome> out(messages.size());
  if (messages.empty()) return out;
  if (Status s = ValidateId(options_.consumer); !s.ok()) {
    for (auto& o : out) o = Failed(s.WithContext("consumer name"));
    return out;
  }
  // All markers go in with one call (one statement where the store can), so
  // a batch costs one round trip for its markers. A single message needs no
  // savepoint: its failure rolls back the whole transaction. In a batch each
  // handler runs under a savepoint, so a failure undoes only that message's
  // writes, and its marker is deleted again.
  const bool batch = messages.size() > 1;
  const int64_t now = options_.env->NowMs();
  std::vector<size_t> index;  // markers[k] belongs to messages[index[k]]
  std::vector<Marker> markers;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (Status s = ValidateId(messages[i].id); !s.ok()) {
      out[i] = Failed(s);
      continue;
    }
    index.push_back(i);
    markers.push_back(Marker{options_.consumer, messages[i].id, FingerprintOf(messages[i].payload), now});
  }
  if (markers.empty()) {
    for (auto& o : out) Count(o);
    return out;
  }
  std::vector<bool> pending(messages.size(), false);  // applied if the commit succeeds

  auto tx_or = store_.Begin();
  if (!tx_or.ok()) {
    for (size_t i : index) out[i] = Failed(tx_or.status());
    for (auto& o : out) Count(o);
    return out;
  }
  StoreTransaction& tx = **tx_or;

  auto abort_all = [&](const Status& s) {
    tx.Rollback();
    for (size_t i : index)
      if (out[i].kind != Outcome::Kind::kFailed || out[i].status.ok()) out[i] = Failed(s);
    for (auto& o : out) Count(o);
    return out;
  };

  auto existing = tx.InsertMarkers(markers);
  if (!existing.ok()) return abort_all(existing.status());
  if (existing->size() != markers.size()) return abort_all(Status::Internal("InsertMarkers answered the wrong count"));
  std::unordered_set<std::string_view> failed_ids;  // handler failed: its marker is gone again

  for (size_t k = 0; k < markers.size(); ++k) {
    const size_t i = index[k];
    const Message& m = messages[i];
    const Marker& marker = markers[k];
    if (batch && k == markers.size() / 2) IDEM_KILL_POINT("inbox.batch_mid");
    if ((*existing)[k].has_value()) {
      if (failed_ids.count(m.id) > 0) {
        // Its "duplicate" is an earlier copy in this batch whose handler failed.
        out[i] = Failed(Status::HandlerFailed("an earlier copy of this message in the batch failed"));
        continue;
      }
      const Fingerprint& stored = *(*existing)[k];
      if (stored == marker.fingerprint) {
        out[i].kind = Outcome::Kind::kDuplicate;
      } else {
        out[i].kind = Outcome::Kind::kConflict;
        out[i].stored_fingerprint = stored;
        out[i].incoming_fingerprint = marker.fingerprint;
        DeadLetter letter{options_.consumer, m.id, "conflict",
                          "id reused for a different payload: stored fingerprint " + ToHex(stored) +
                              ", incoming " + ToHex(marker.fingerprint),
                          m.attempt, m.payload, now};
        if (Status s = tx.PutDeadLetter(letter); !s.ok()) return abort_all(s);
      }
      continue;
    }
    IDEM_KILL_POINT("inbox.after_marker");
    if (batch) {
      if (Status s = tx.Savepoint(); !s.ok()) return abort_all(s);
    }
    Status hs = RunHandler(handler, tx, m);
    if (!hs.ok()) {
      out[i] = Failed(hs);
      if (!batch) return abort_all(hs);
      if (Status s = tx.RollbackToSavepoint(); !s.ok()) return abort_all(s);
      if (Status s = tx.DeleteMarker(options_.consumer, m.id); !s.ok()) return abort_all(s);
      failed_ids.insert(m.id);
      continue;
    }
    if (batch) {
      if (Status s = tx.ReleaseSavepoint(); !s.ok()) return abort_all(s);
    }
    pending[i] = true;
  }

  IDEM_KILL_POINT("inbox.after_work");
  Status cs = tx.Commit();
  if (cs.code() == Code::kInDoubt) {
    ResolveInDoubt(messages, pending, out, cs);
  } else if (!cs.ok()) {
    // Nothing of the transaction is saved. Duplicates and conflicts found in
    // it are still true, but a conflict's dead letter was not written, so
    // every message must be delivered again.
    for (auto& o : out)
      if (o.kind != Outcome::Kind::kFailed || o.status.ok()) o = Failed(cs);
  } else {
    for (size_t i = 0; i < out.size(); ++i)
      if (pending[i]) out[i].kind = Outcome::Kind::kApplied;
  }
  IDEM_KILL_POINT("inbox.after_commit");
  for (auto& o : out) Count(o);
  return out;
}

void Inbox::ResolveInDoubt(std::span<const Message> messages, const std::vector<bool>& pending,
                           std::vector<Outcome>& out, const Status& s) {
  // The commit may or may not have happened. Never retry blindly: read each
  // marker back on a fresh connection. Present means the effect is committed
  // (by us, or by a racing consumer): safe to acknowledge.
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!pending[i]) continue;
    auto found = store_.FindMarker(options_.consumer, messages[i].id);
    if (!found.ok()) {
      out[i] = Failed(s.WithContext("commit outcome unknown and the marker could not be read (" +
                                    found.status().ToString() + ")"));
    } else if (!found->has_value()) {
      out[i] = Failed(s.WithContext("no committed marker found after it, so it is treated as not committed and not acknowledged"));
    } else {
      out[i].kind = Outcome::Kind::kApplied;
    }
  }
}

void Inbox::Count(const Outcome& o) {
  switch (o.kind) {
    case Outcome::Kind::kApplied: applied_.fetch_add(1, std::memory_order_relaxed); break;
    case Outcome::Kind::kDuplicate: duplicates_.fetch_add(1, std::memory_order_relaxed); break;
    case Outcome::Kind::kConflict: conflicts_.fetch_add(1, std::memory_order_relaxed); break;
    case Outcome::Kind::kFailed: failures_.fetch_add(1, std::memory_order_relaxed); break;
  }
}

InboxCounters Inbox::counters() const {
  return {applied_.load(), duplicates_.load(), conflicts_.load(), failures_.load(), dead_lettered_.load()};
}

}  // namespace idem
