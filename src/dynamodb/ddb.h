// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the DynamoDB store (idem/dynamodb/store.h). One table of idem's,
// key pk (S) and sk (B):
//   markers       pk "m|<consumer>"  sk id     fp (B), at (N ms), expires_at (N s, with a TTL)
//   failures      pk "f|<consumer>"  sk id     attempts, last_error, updated_at, in_progress_since, parked_at
//   dead letters  pk "d|<consumer>"  sk id     reason, error, attempts, payload (B), at
//   claims        pk "c|<scope>"     sk key    state, fp, fence, lease_until, done_until (ms), result (B), is_error,
//   updated_at the fence     pk "fence"         sk "n"    v (N): claims' fencing counter (ADD)
#ifndef IDEM_SRC_DYNAMODB_DDB_H_
#define IDEM_SRC_DYNAMODB_DDB_H_

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "aws/client.h"
#include "core/claim_rules.h"
#include "idem/claim_store.h"
#include "idem/dynamodb/items.h"
#include "idem/dynamodb/store.h"
#include "idem/store.h"

namespace idem::dynamodb_internal {

using json = nlohmann::json;
using dynamodb::Attr;
using dynamodb::Condition;
using dynamodb::Item;

// DynamoDB's limit on the writes of one TransactWriteItems.
inline constexpr int kMaxTransactItems = 100;

// The DynamoDB transaction `tx` is (or wraps), or nullptr.
dynamodb::Items* ItemsIn(Transaction& tx);
// Registers (live) or forgets a transaction's NativeHandle for ItemsOf.
void RegisterLive(const void* handle, bool live);

std::string Base64(std::string_view bytes);
Result<std::string> Unbase64(std::string_view text);

// Attribute values of idem's own records.
inline json S(std::string_view s) { return {{"S", s}}; }
inline json N(int64_t n) { return {{"N", std::to_string(n)}}; }
json B(std::string_view bytes);
// An attribute of an item in DynamoDB's JSON (`fallback` when absent).
int64_t GetN(const json& item, const char* name, int64_t fallback = 0);
std::string GetS(const json& item, const char* name);
std::string GetB(const json& item, const char* name);
json Key(std::string_view pk, std::string_view sk);
Fingerprint ToFp(const std::string& bytes);

// `list` sorted newest first by `at` (a member pointer), cut to `limit`.
template <typename T>
void NewestFirst(std::vector<T>& list, int64_t T::*at, int limit) {
  std::stable_sort(list.begin(), list.end(), [at](const T& a, const T& b) { return a.*at > b.*at; });
  if (list.size() > static_cast<size_t>(limit)) list.resize(static_cast<size_t>(limit));
}

// The user's values to DynamoDB's JSON and back.
Result<json> ToJson(const Attr& a);
Result<json> ToJson(const Item& item);
Result<Item> ItemFromJson(const json& j);

class DdbStore;

// A transaction: the writes queued for one TransactWriteItems.
class DdbTransaction final : public StoreTransaction, public dynamodb::Items {
 public:
  explicit DdbTransaction(DdbStore& store);
  ~DdbTransaction() override;

  // idem::Transaction: no SQL here.
  Result<int64_t> Exec(std::string_view sql, std::span<const Value> params) override;
  Result<Rows> Query(std::string_view sql, std::span<const Value> params) override;
  void* NativeHandle() override { return static_cast<dynamodb::Items*>(this); }

  // Items.
  Status Put(std::string_view table, Item item, Condition condition) override;
  Status Update(std::string_view table, Item key, std::string_view update, Condition condition) override;
  Status Delete(std::string_view table, Item key, Condition condition) override;
  Status ConditionCheck(std::string_view table, Item key, Condition condition) override;
  Result<std::optional<Item>> Get(std::string_view table, const Item& key) override;
  int Queued() const override { return static_cast<int>(ops_.size()); }

  // StoreTransaction.
  Result<std::optional<Fingerprint>> InsertMarker(const Marker& marker) override;
  Result<std::vector<std::optional<Fingerprint>>> InsertMarkers(std::span<const Marker> markers) override;
  Status PutDeadLetter(const DeadLetter& letter) override;
  Result<ClaimOutcome> ClaimInTransaction(const ClaimRequest& request) override;
  Status CompleteInTransaction(const ClaimToken& token, std::string_view result, bool is_error,
                               int64_t retention_ms) override;
  Status Commit() override;
  void Rollback() noexcept override;

 private:
  // What each queued write is, for the commit's error.
  enum class Role { kMarker, kItem, kClaim, kDeadLetter };
  struct Op {
    Role role;
    std::string what;          // "marker of 'id'", "Put on table 't'"
    std::string consumer, id;  // kMarker
  };
  Status Usable() const;
  Status Queue(Role role, std::string what, json op);
  Status UserWrite(const char* kind, std::string_view table, json body, const Condition& condition);
  // A claim queued in this transaction, so later calls in it see it.
  struct PendingClaim {
    ClaimRecord record;
    size_t op;       // its write in ops_
    json condition;  // the write's condition (kept when it is replaced)
  };
  Status AnswerCancelled(const aws_internal::ServiceError& e, bool& again);

  DdbStore& store_;
  std::vector<json> ops_;
  std::vector<Op> roles_;
  std::map<std::pair<std::string, std::string>, PendingClaim> claims_;
  std::string token_;  // ClientRequestToken: one per transaction
  bool done_ = false;
};

class DdbStore final : public Store, public ClaimStore {
 public:
  static Result<std::unique_ptr<DdbStore>> Make(const dynamodb::Store::Options& o);

  Result<std::unique_ptr<StoreTransaction>> Begin() override;
  Result<std::optional<Marker>> FindMarker(std::string_view consumer, std::string_view id,
                                           std::optional<int64_t> produced_at_ms = std::nullopt) override;
  Result<int64_t> Purge(std::string_view consumer, int64_t before_ms, int batch_size) override;
  Result<int64_t> CountMarkers(std::string_view consumer) override;
  Result<std::vector<Marker>> ListMarkers(std::string_view consumer, int limit) override;
  Result<std::vector<DeadLetter>> ListDeadLetters(std::string_view consumer, int limit) override;
  Result<SchemaInfo> Schema() override;
  std::string_view Kind() const override { return "dynamodb"; }
  ClaimStore* claim_store() override { return this; }
  Result<FailureCount> RecordFailure(const FailureRecord& failure) override;
  Status ClearFailures(std::string_view consumer, std::string_view id) override;

  // ClaimStore (claims.cc).
  Result<ClaimOutcome> TryClaim(const ClaimRequest& request) override;
  Status Complete(const ClaimToken& token, std::string_view result, bool is_error, int64_t retention_ms) override;
  Status Release(const ClaimToken& token) override;
  Result<int64_t> Extend(const ClaimToken& token, int64_t lease_ms) override;
  Result<std::optional<ClaimRecord>> FindClaim(std::string_view scope, std::string_view key) override;
  Result<std::vector<ClaimRecord>> ListClaims(std::string_view scope, int limit) override;
  Result<std::optional<ClaimOutcome>> Peek(const ClaimRequest& request) override;
  Result<int64_t> CountClaims(std::string_view scope) override;
  Result<int64_t> PurgeClaims(std::string_view scope, int64_t abandoned_after_ms, int batch_size) override;
  Result<int64_t> NowMs() override { return claim_clock_->NowMs(); }

  // One call; the service's error as a Status (`what` first).
  Result<json> Call(std::string_view operation, json input, std::string_view what);
  // One call; a ConditionalCheckFailedException is `false`, success `true`.
  Result<bool> CallIf(std::string_view operation, json input, std::string_view what);
  Result<aws_internal::Reply> Raw(std::string_view operation, const json& input);
  // A strongly consistent GetItem of idem's table (null: none).
  Result<json> GetRecord(std::string_view pk, std::string_view sk);
  // Every item of one pk (Query), or of every pk that starts with `prefix`
  // (Scan) when `pk` is empty; `projection` names the attributes.
  Result<std::vector<json>> ReadAll(std::string_view pk, std::string_view prefix, const char* projection);
  // Deletes the keys (BatchWriteItem, 25 at a time).
  Status DeleteKeys(const std::vector<json>& keys);
  // A new fencing token (the counter's ADD).
  Result<int64_t> NextFence();
  // The claims' record write that starts a claim: the item, and its
  // condition against what was seen (`seen`: null for none).
  json ClaimPut(const ClaimRequest& r, int64_t fence, int64_t now, const json& seen);
  Status LeaseLost(const ClaimToken& t, bool completed_ok);

  // Markers a cancelled commit found present: the Inbox runs the batch
  // again, and InsertMarkers answers these without a read. Markers are
  // never rewritten, so what was learned stays true until a purge (Forget;
  // a purge by another process leaves a message judged a duplicate here,
  // which it was). At most 10,000 kept.
  void Learn(const std::string& consumer, const std::string& id, const Fingerprint& fp);
  std::optional<Fingerprint> Recall(const std::string& consumer, const std::string& id);
  void Forget();

  // For the idem command's demo effects (tools/idem/payments.cc): a table
  // of the account's made (on-demand billing, key `hash` S and `range` S)
  // when missing, or `emptied` (deleted and made again); every item of a
  // table (Scan); the failure counts and dead letters of `consumer` deleted.
  Status MakeTable(const std::string& name, const std::string& hash, const std::string& range, bool emptied);
  Result<std::vector<json>> ScanTable(const std::string& name);
  Status ForgetFailures(std::string_view consumer);

  const std::string& table() const { return table_; }
  Env* env() const { return env_; }
  Env* claim_clock() const { return claim_clock_; }
  int64_t marker_ttl_s() const { return marker_ttl_s_; }

 private:
  DdbStore() = default;
  Status CheckTable(bool create_if_missing);

  std::unique_ptr<aws_internal::JsonClient> client_;
  std::string table_;
  Env* env_ = nullptr;
  Env* claim_clock_ = nullptr;
  int64_t marker_ttl_s_ = 0;
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, Fingerprint> learned_;
};

// Claims (claims.cc): a record as a ClaimRecord; the partition of a scope.
// What a record answers without a write, and a claim that starts, are
// core/claim_rules.h's.
ClaimRecord ToClaimRecord(const json& item);
std::string ClaimPk(std::string_view scope);
using internal::DecideClaim;
using internal::DescribeClaimToken;
using internal::StartedClaim;

}  // namespace idem::dynamodb_internal

#endif  // IDEM_SRC_DYNAMODB_DDB_H_
