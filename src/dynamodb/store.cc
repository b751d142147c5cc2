// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// The DynamoDB store: transactions (TransactWriteItems), markers, failure
// counts, dead letters, purge, inspection, the table, the URL.
#include <algorithm>
#include <cctype>
#include <random>
#include <set>

#include "core/kill_point.h"
#include "dynamodb/ddb.h"
#include "idem/url.h"

namespace idem::dynamodb_internal {
namespace {

constexpr const char* kNoSql =
    "the DynamoDB store runs no SQL: write items with idem::dynamodb::ItemsOf(tx) (idem/dynamodb/items.h)";
// A commit cancelled by a conflict with another transaction in flight
// (TransactionConflict) is sent again, with a new token, this many times.
constexpr int kConflictTries = 8;

std::string MarkerPk(std::string_view consumer) { return "m|" + std::string(consumer); }
std::string FailurePk(std::string_view consumer) { return "f|" + std::string(consumer); }
std::string DeadPk(std::string_view consumer) { return "d|" + std::string(consumer); }

std::string FpBytes(const Fingerprint& fp) { return std::string(reinterpret_cast<const char*>(fp.data()), fp.size()); }

// A ClientRequestToken: 128 bits from the system's random source, drawn
// per commit (a generator's state would be copied into a forked process,
// which would then send another transaction under a token already used).
std::string NewToken() {
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string t;
  for (int word = 0; word < 4; ++word) {
    uint32_t v = rd();
    for (int i = 0; i < 8; ++i, v >>= 4) t += kHex[v & 15];
  }
  return t;
}

Status CheckLimit(int limit) {
  if (limit < 0) return Status::InvalidArgument("a list limit cannot be negative, got " + std::to_string(limit));
  return Status::OK();
}

// A user's condition as the operation's expression fields.
Status AddCondition(json& body, const Condition& c) {
  if (!c.expression.empty()) body["ConditionExpression"] = c.expression;
  if (!c.names.empty()) {
    json names = json::object();
    for (const auto& [k, v] : c.names) {
      if (k.empty() || k[0] != '#')
        return Status::InvalidArgument("a name placeholder must start with '#': '" + k + "'");
      names[k] = v;
    }
    body["ExpressionAttributeNames"] = std::move(names);
  }
  if (!c.values.empty()) {
    for (const auto& [k, v] : c.values)
      if (k.empty() || k[0] != ':')
        return Status::InvalidArgument("a value placeholder must start with ':': '" + k + "'");
    IDEM_ASSIGN_OR_RETURN(body["ExpressionAttributeValues"], ToJson(c.values));
  }
  return Status::OK();
}

}  // namespace

// ------------------------------------------------------------ DdbTransaction

DdbTransaction::DdbTransaction(DdbStore& store) : store_(store) { RegisterLive(NativeHandle(), true); }
DdbTransaction::~DdbTransaction() {
  Rollback();
  RegisterLive(NativeHandle(), false);
}

Status DdbTransaction::Usable() const {
  return done_ ? Status::Internal("transaction already committed or rolled back") : Status::OK();
}

Result<int64_t> DdbTransaction::Exec(std::string_view, std::span<const Value>) {
  return Status::InvalidArgument(kNoSql);
}
Result<Rows> DdbTransaction::Query(std::string_view, std::span<const Value>) { return Status::InvalidArgument(kNoSql); }

Status DdbTransaction::Queue(Role role, std::string what, json op) {
  IDEM_RETURN_IF_ERROR(Usable());
  if (ops_.size() >= static_cast<size_t>(kMaxTransactItems))
    return Status::InvalidArgument("a DynamoDB transaction holds at most " + std::to_string(kMaxTransactItems) +
                                   " writes (TransactWriteItems), the markers included: " + what +
                                   " would be one more; hand the consumer smaller batches");
  ops_.push_back(std::move(op));
  roles_.push_back(Op{role, std::move(what), {}, {}});
  return Status::OK();
}

Status DdbTransaction::UserWrite(const char* kind, std::string_view table, json body, const Condition& condition) {
  if (table.empty()) return Status::InvalidArgument(std::string(kind) + ": an empty table name");
  body["TableName"] = std::string(table);
  IDEM_RETURN_IF_ERROR(AddCondition(body, condition));
  return Queue(Role::kItem, std::string(kind) + " on table '" + std::string(table) + "'",
               json{{kind, std::move(body)}});
}

Status DdbTransaction::Put(std::string_view table, Item item, Condition condition) {
  if (item.empty()) return Status::InvalidArgument("Put: an empty item");
  IDEM_ASSIGN_OR_RETURN(json j, ToJson(item));
  return UserWrite("Put", table, json{{"Item", std::move(j)}}, condition);
}

Status DdbTransaction::Update(std::string_view table, Item key, std::string_view update, Condition condition) {
  if (key.empty()) return Status::InvalidArgument("Update: an empty key");
  if (update.empty()) return Status::InvalidArgument("Update: an empty update expression");
  IDEM_ASSIGN_OR_RETURN(json k, ToJson(key));
  return UserWrite("Update", table, json{{"Key", std::move(k)}, {"UpdateExpression", std::string(update)}}, condition);
}

Status DdbTransaction::Delete(std::string_view table, Item key, Condition condition) {
  if (key.empty()) return Status::InvalidArgument("Delete: an empty key");
  IDEM_ASSIGN_OR_RETURN(json k, ToJson(key));
  return UserWrite("Delete", table, json{{"Key", std::move(k)}}, condition);
}

Status DdbTransaction::ConditionCheck(std::string_view table, Item key, Condition condition) {
  if (key.empty()) return Status::InvalidArgument("ConditionCheck: an empty key");
  if (condition.expression.empty()) return Status::InvalidArgument("ConditionCheck: an empty condition");
  IDEM_ASSIGN_OR_RETURN(json k, ToJson(key));
  return UserWrite("ConditionCheck", table, json{{"Key", std::move(k)}}, condition);
}

Result<std::optional<Item>> DdbTransaction::Get(std::string_view table, const Item& key) {
  IDEM_RETURN_IF_ERROR(Usable());
  if (table.empty()) return Status::InvalidArgument("Get: an empty table name");
  IDEM_ASSIGN_OR_RETURN(json k, ToJson(key));
  IDEM_ASSIGN_OR_RETURN(
      json r, store_.Call("GetItem", {{"TableName", std::string(table)}, {"Key", k}, {"ConsistentRead", true}},
                          "DynamoDB GetItem on table '" + std::string(table) + "'"));
  if (!r.contains("Item")) return std::optional<Item>();
  IDEM_ASSIGN_OR_RETURN(Item item, ItemFromJson(r["Item"]));
  return std::optional<Item>(std::move(item));
}

Result<std::optional<Fingerprint>> DdbTransaction::InsertMarker(const Marker& m) {
  IDEM_ASSIGN_OR_RETURN(auto r, InsertMarkers(std::span<const Marker>(&m, 1)));
  return r.front();
}

// Optimistic: each new marker is a Put conditioned on attribute_not_exists,
// answered "inserted" now and proved at commit, where a marker that exists
// cancels the transaction (Commit: kDuplicate, the marker learned) and the
// Inbox runs the batch again, finding it here without a read.
Result<std::vector<std::optional<Fingerprint>>> DdbTransaction::InsertMarkers(std::span<const Marker> markers) {
  IDEM_RETURN_IF_ERROR(Usable());
  std::vector<std::optional<Fingerprint>> out(markers.size());
  std::map<std::string_view, size_t> first;  // id -> its first copy in this call
  for (size_t i = 0; i < markers.size(); ++i) {
    const Marker& m = markers[i];
    if (auto f = first.find(m.id); f != first.end()) {
      out[i] = markers[f->second].fingerprint;  // a later copy sees the first
      continue;
    }
    first.emplace(m.id, i);
    if (auto known = store_.Recall(m.consumer, m.id)) {
      out[i] = *known;
      continue;
    }
    json item = Key(MarkerPk(m.consumer), m.id);
    item["fp"] = B(FpBytes(m.fingerprint));
    item["at"] = N(m.processed_at_ms);
    if (store_.marker_ttl_s() > 0) item["expires_at"] = N(m.processed_at_ms / 1000 + store_.marker_ttl_s());
    IDEM_RETURN_IF_ERROR(Queue(Role::kMarker, "the marker of '" + m.id + "'",
                               json{{"Put",
                                     {{"TableName", store_.table()},
                                      {"Item", std::move(item)},
                                      {"ConditionExpression", "attribute_not_exists(pk)"},
                                      {"ReturnValuesOnConditionCheckFailure", "ALL_OLD"}}}}));
    roles_.back().consumer = m.consumer;
    roles_.back().id = m.id;
  }
  return out;
}

Status DdbTransaction::PutDeadLetter(const DeadLetter& d) {
  json item = Key(DeadPk(d.consumer), d.id);
  item["reason"] = S(d.reason);
  item["error"] = S(d.error);
  item["attempts"] = N(d.attempts);
  item["payload"] = B(d.payload);
  item["at"] = N(d.at_ms);
  return Queue(Role::kDeadLetter, "the dead letter of '" + d.id + "'",
               json{{"Put", {{"TableName", store_.table()}, {"Item", std::move(item)}}}});
}

Result<ClaimOutcome> DdbTransaction::ClaimInTransaction(const ClaimRequest& r) {
  IDEM_RETURN_IF_ERROR(Usable());
  const int64_t now = store_.claim_clock()->NowMs();
  const auto key = std::make_pair(r.scope, r.key);
  if (auto it = claims_.find(key); it != claims_.end()) {
    if (auto answered = DecideClaim(it->second.record, r, now)) return std::move(*answered);
    return Status::Busy("claim of key '" + r.key + "' in scope '" + r.scope +
                        "': claimed twice in one transaction past its lease");
  }
  IDEM_ASSIGN_OR_RETURN(json seen, store_.GetRecord(ClaimPk(r.scope), r.key));
  bool took_over = false;
  if (!seen.is_null()) {
    const ClaimRecord rec = ToClaimRecord(seen);
    if (auto answered = DecideClaim(rec, r, now)) return std::move(*answered);
    took_over = rec.state == ClaimRecord::State::kInProgress;
  }
  IDEM_ASSIGN_OR_RETURN(int64_t fence, store_.NextFence());
  json put = store_.ClaimPut(r, fence, now, seen);
  json condition = put;
  condition.erase("Item");
  condition.erase("TableName");
  IDEM_RETURN_IF_ERROR(Queue(Role::kClaim, "the claim of '" + r.key + "'", json{{"Put", put}}));
  ClaimRecord rec;
  rec.scope = r.scope;
  rec.key = r.key;
  rec.fingerprint = r.fingerprint;
  rec.fence = fence;
  rec.lease_until_ms = now + r.lease_ms;
  rec.updated_at_ms = now;
  claims_[key] = PendingClaim{rec, ops_.size() - 1, std::move(condition)};
  return StartedClaim(r, fence, now + r.lease_ms, took_over);
}

Status DdbTransaction::CompleteInTransaction(const ClaimToken& t, std::string_view result, bool is_error,
                                             int64_t retention_ms) {
  IDEM_RETURN_IF_ERROR(Usable());
  const int64_t now = store_.claim_clock()->NowMs();
  auto it = claims_.find(std::make_pair(t.scope, t.key));
  if (it != claims_.end()) {
    PendingClaim& p = it->second;
    if (p.record.fence != t.fence)
      return Status::LeaseLost(DescribeClaimToken(t) + ": the key is held by fence " + std::to_string(p.record.fence));
    if (p.record.state == ClaimRecord::State::kCompleted) return Status::OK();
    // The claim's own write, now written completed (one write per item).
    json& put = ops_[p.op]["Put"];
    put["Item"]["state"] = N(1);
    put["Item"]["result"] = B(result);
    put["Item"]["is_error"] = N(is_error ? 1 : 0);
    put["Item"]["done_until"] = N(now + retention_ms);
    put["Item"]["updated_at"] = N(now);
    p.record.state = ClaimRecord::State::kCompleted;
    return Status::OK();
  }
  IDEM_ASSIGN_OR_RETURN(json seen, store_.GetRecord(ClaimPk(t.scope), t.key));
  if (seen.is_null() || GetN(seen, "fence") != t.fence || GetN(seen, "state") != 0)
    return store_.LeaseLost(t, /*completed_ok=*/true);
  json update = {
      {"TableName", store_.table()},
      {"Key", Key(ClaimPk(t.scope), t.key)},
      {"UpdateExpression", "SET #st = :done, #res = :res, is_error = :err, done_until = :exp, updated_at = :now"},
      {"ConditionExpression", "fence = :f AND #st = :prog"},
      {"ExpressionAttributeNames", {{"#st", "state"}, {"#res", "result"}}},
      {"ExpressionAttributeValues",
       {{":done", N(1)},
        {":prog", N(0)},
        {":res", B(result)},
        {":err", N(is_error ? 1 : 0)},
        {":exp", N(now + retention_ms)},
        {":now", N(now)},
        {":f", N(t.fence)}}}};
  IDEM_RETURN_IF_ERROR(Queue(Role::kClaim, "the completion of '" + t.key + "'", json{{"Update", std::move(update)}}));
  ClaimRecord rec = ToClaimRecord(seen);
  rec.state = ClaimRecord::State::kCompleted;
  claims_[std::make_pair(t.scope, t.key)] = PendingClaim{rec, ops_.size() - 1, json()};
  return Status::OK();
}

// What a TransactionCanceledException says, as this commit's answer.
// `again`: cancelled only by other transactions in flight (send it again).
Status DdbTransaction::AnswerCancelled(const aws_internal::ServiceError& e, bool& again) {
  again = false;
  const json* reasons = e.body.contains("CancellationReasons") ? &e.body["CancellationReasons"] : nullptr;
  if (reasons == nullptr || !reasons->is_array())
    return aws_internal::ToStatus(e, "DynamoDB TransactWriteItems on table '" + store_.table() + "'");
  std::vector<std::string> duplicates, failed;
  bool conflict = false, throttled = false, other = false;
  std::string first_other;
  for (size_t i = 0; i < reasons->size() && i < roles_.size(); ++i) {
    const json& r = (*reasons)[i];
    const std::string code = r.value("Code", std::string("None"));
    if (code == "None") continue;
    const Op& op = roles_[i];
    if (code == "ConditionalCheckFailed" && op.role == Role::kMarker) {
      Fingerprint fp{};
      if (r.contains("Item")) {
        fp = ToFp(GetB(r["Item"], "fp"));
      } else {  // an emulator without ReturnValuesOnConditionCheckFailure: read it
        IDEM_ASSIGN_OR_RETURN(json seen, store_.GetRecord(MarkerPk(op.consumer), op.id));
        if (seen.is_null()) {
          conflict = true;  // purged since: the next try inserts it
          continue;
        }
        fp = ToFp(GetB(seen, "fp"));
      }
      store_.Learn(op.consumer, op.id, fp);
      duplicates.push_back(op.id);
    } else if (code == "ConditionalCheckFailed") {
      failed.push_back(op.what + " (write " + std::to_string(i + 1) + ")");
    } else if (code == "TransactionConflict") {
      conflict = true;
    } else if (code == "ThrottlingError" || code == "ProvisionedThroughputExceeded") {
      throttled = true;
    } else {
      other = true;
      if (first_other.empty()) first_other = code + " on " + op.what + ": " + r.value("Message", std::string());
    }
  }
  const std::string what = "DynamoDB transaction on table '" + store_.table() + "' cancelled, nothing written: ";
  if (!duplicates.empty())
    return Status::Duplicate(what + "the marker of '" + duplicates.front() +
                             "' was committed by another transaction meanwhile");
  if (!failed.empty()) return Status::Conflict(what + "the condition of " + failed.front() + " failed");
  if (other) return Status::InvalidArgument(what + first_other);
  if (throttled) return Status::Busy(what + "throttled");
  if (conflict) {
    again = true;
    return Status::Busy(what + "it conflicted with other transactions in flight " + std::to_string(kConflictTries) +
                        " times in a row; retry");
  }
  return aws_internal::ToStatus(e, what);
}

Status DdbTransaction::Commit() {
  IDEM_RETURN_IF_ERROR(Usable());
  if (ops_.empty()) {
    done_ = true;
    return Status::OK();
  }
  Status last;
  for (int attempt = 0; attempt < kConflictTries; ++attempt) {
    // One token per try: JsonClient sends a lost answer's request again
    // with it, and DynamoDB applies it at most once.
    token_ = NewToken();
    IDEM_KILL_POINT("dynamodb.before_commit");
    auto reply = store_.Raw("TransactWriteItems", json{{"TransactItems", ops_}, {"ClientRequestToken", token_}});
    if (!reply.ok()) {  // kInDoubt (sent, never answered), kUnavailable (never sent), kAborted
      done_ = true;
      return reply.status().WithContext("DynamoDB TransactWriteItems on table '" + store_.table() + "'");
    }
    if (!reply->error) {
      // Committed; the caller has not learned it yet (a crash here leaves
      // the message unacknowledged with its effect: the marker absorbs it).
      IDEM_KILL_POINT("dynamodb.commit_done");
      done_ = true;
      return Status::OK();
    }
    if (reply->error->type == "TransactionInProgressException") {
      // The same token's transaction is still being applied: it may commit.
      done_ = true;
      return Status::InDoubt("DynamoDB TransactWriteItems on table '" + store_.table() +
                             "': still in progress after every try (" + reply->error->message + ")");
    }
    if (reply->error->type != "TransactionCanceledException") {
      done_ = true;
      return aws_internal::ToStatus(*reply->error, "DynamoDB TransactWriteItems on table '" + store_.table() + "'");
    }
    bool again = false;
    last = AnswerCancelled(*reply->error, again);
    if (!again) break;
    store_.env()->SleepMs(5 + static_cast<int64_t>(store_.env()->Random() % (10 << std::min(attempt, 5))));
  }
  done_ = true;
  return last;
}

void DdbTransaction::Rollback() noexcept {
  done_ = true;
  ops_.clear();
  roles_.clear();
  claims_.clear();
}

// ------------------------------------------------------------------ DdbStore

Result<aws_internal::Reply> DdbStore::Raw(std::string_view operation, const json& input) {
  return client_->Call(operation, input);
}

Result<json> DdbStore::Call(std::string_view operation, json input, std::string_view what) {
  IDEM_ASSIGN_OR_RETURN(aws_internal::Reply r, client_->Call(operation, input));
  if (r.error) return aws_internal::ToStatus(*r.error, what);
  return std::move(r.body);
}

Result<bool> DdbStore::CallIf(std::string_view operation, json input, std::string_view what) {
  IDEM_ASSIGN_OR_RETURN(aws_internal::Reply r, client_->Call(operation, input));
  if (r.error && r.error->type == "ConditionalCheckFailedException") return false;
  if (r.error) return aws_internal::ToStatus(*r.error, what);
  return true;
}

Result<json> DdbStore::GetRecord(std::string_view pk, std::string_view sk) {
  IDEM_ASSIGN_OR_RETURN(json r, Call("GetItem", {{"TableName", table_}, {"Key", Key(pk, sk)}, {"ConsistentRead", true}},
                                     "DynamoDB GetItem on table '" + table_ + "'"));
  if (!r.contains("Item")) return json();
  return std::move(r["Item"]);
}

Result<std::vector<json>> DdbStore::ReadAll(std::string_view pk, std::string_view prefix, const char* projection) {
  std::vector<json> out;
  json in = {{"TableName", table_}, {"ConsistentRead", true}};
  if (projection != nullptr) {
    in["ProjectionExpression"] = projection;
    in["ExpressionAttributeNames"] = {{"#st", "state"}, {"#res", "result"}, {"#k", "pk"}, {"#at", "at"}};
  }
  const char* op = "Query";
  if (!pk.empty()) {
    in["KeyConditionExpression"] = "pk = :pk";
    in["ExpressionAttributeValues"] = {{":pk", S(pk)}};
  } else {
    op = "Scan";
    in["FilterExpression"] = "begins_with(pk, :p)";
    in["ExpressionAttributeValues"] = {{":p", S(prefix)}};
  }
  if (projection != nullptr) {
    // Only the placeholders the projection uses may be sent.
    json names = json::object();
    for (const auto& [k, v] : in["ExpressionAttributeNames"].items())
      if (std::string_view(projection).find(k) != std::string_view::npos) names[k] = v;
    if (names.empty()) {
      in.erase("ExpressionAttributeNames");
    } else {
      in["ExpressionAttributeNames"] = names;
    }
  }
  for (;;) {
    IDEM_ASSIGN_OR_RETURN(json r, Call(op, in, std::string("DynamoDB ") + op + " on table '" + table_ + "'"));
    for (auto& item : r["Items"]) out.push_back(std::move(item));
    if (!r.contains("LastEvaluatedKey")) return out;
    in["ExclusiveStartKey"] = r["LastEvaluatedKey"];
  }
}

Status DdbStore::DeleteKeys(const std::vector<json>& keys) {
  for (size_t from = 0; from < keys.size(); from += 25) {
    json requests = json::array();
    for (size_t i = from; i < std::min(keys.size(), from + 25); ++i)
      requests.push_back({{"DeleteRequest", {{"Key", keys[i]}}}});
    json items = {{table_, requests}};
    for (int round = 0; !items.empty(); ++round) {
      if (round == 10)
        return Status::Busy("DynamoDB BatchWriteItem on table '" + table_ + "': deletes left unprocessed");
      IDEM_ASSIGN_OR_RETURN(json r, Call("BatchWriteItem", {{"RequestItems", items}},
                                         "DynamoDB BatchWriteItem on table '" + table_ + "'"));
      items = r.value("UnprocessedItems", json::object());
      if (!items.empty()) env_->SleepMs(20 << std::min(round, 5));
    }
  }
  return Status::OK();
}

void DdbStore::Learn(const std::string& consumer, const std::string& id, const Fingerprint& fp) {
  std::lock_guard<std::mutex> l(mu_);
  if (learned_.size() > 10'000) learned_.clear();  // a cache: what is dropped is learned again
  learned_[{consumer, id}] = fp;
}

std::optional<Fingerprint> DdbStore::Recall(const std::string& consumer, const std::string& id) {
  // Kept, not taken: a batch holding several markers that exist may learn
  // them one per cancelled commit (DynamoDB Local names one reason), and
  // each run again must find all it learned so far.
  std::lock_guard<std::mutex> l(mu_);
  auto it = learned_.find({consumer, id});
  if (it == learned_.end()) return std::nullopt;
  return it->second;
}

void DdbStore::Forget() {
  std::lock_guard<std::mutex> l(mu_);
  learned_.clear();
}

Result<std::unique_ptr<StoreTransaction>> DdbStore::Begin() {
  return std::unique_ptr<StoreTransaction>(new DdbTransaction(*this));
}

Result<std::optional<Marker>> DdbStore::FindMarker(std::string_view consumer, std::string_view id,
                                                   std::optional<int64_t>) {
  IDEM_ASSIGN_OR_RETURN(json item, GetRecord(MarkerPk(consumer), id));
  if (item.is_null()) return std::optional<Marker>();
  return std::optional<Marker>(
      Marker{std::string(consumer), std::string(id), ToFp(GetB(item, "fp")), GetN(item, "at")});
}

Result<FailureCount> DdbStore::RecordFailure(const FailureRecord& f) {
  using Kind = FailureRecord::Kind;
  const std::string& id = f.message->id;
  const json fkey = Key(FailurePk(f.consumer), id);
  const std::string what = "DynamoDB failure count of '" + id + "' in table '" + table_ + "'";
  FailureCount count;
  IDEM_ASSIGN_OR_RETURN(json marker, GetRecord(MarkerPk(f.consumer), id));
  if (!marker.is_null()) {
    IDEM_RETURN_IF_ERROR(Call("DeleteItem", {{"TableName", table_}, {"Key", fkey}}, what).status());
    count.already_applied = true;
    return count;
  }
  if (f.kind == Kind::kCrashLoop) {
    IDEM_ASSIGN_OR_RETURN(json found, GetRecord(FailurePk(f.consumer), id));
    if (!found.is_null() && found.contains("in_progress_since")) {
      count.attempts = static_cast<int>(GetN(found, "attempts"));
      count.in_progress = true;
      return count;
    }
  }
  json update = {{"TableName", table_},
                 {"Key", fkey},
                 {"ReturnValues", "ALL_NEW"},
                 {"ExpressionAttributeValues", {{":z", N(0)}, {":e", S(f.error)}, {":t", N(f.now_ms)}}}};
  if (f.kind == Kind::kInProgress) {
    update["UpdateExpression"] =
        "SET attempts = if_not_exists(attempts, :z), last_error = :e, updated_at = :t,"
        " in_progress_since = if_not_exists(in_progress_since, :t)";
  } else {
    update["UpdateExpression"] = "SET attempts = if_not_exists(attempts, :z) + :one, last_error = :e, updated_at = :t";
    update["ExpressionAttributeValues"][":one"] = N(1);
  }
  IDEM_ASSIGN_OR_RETURN(json r, Call("UpdateItem", update, what));
  const json& row = r["Attributes"];
  count.attempts = static_cast<int>(GetN(row, "attempts", 1));
  const bool in_progress = row.contains("in_progress_since");
  const int64_t since = GetN(row, "in_progress_since");
  count.in_progress = in_progress;
  auto dead_letter = [&](const std::string& reason, const std::string& error) -> Status {
    DdbTransaction tx(*this);
    IDEM_RETURN_IF_ERROR(
        tx.PutDeadLetter(DeadLetter{f.consumer, id, reason, error, count.attempts, f.message->payload, f.now_ms}));
    return tx.Commit();
  };
  if (f.kind == Kind::kRejected) {
    count.dead_lettered = true;
    IDEM_RETURN_IF_ERROR(dead_letter("rejected", f.error));
  } else if (in_progress) {
    if (!row.contains("parked_at") && f.park_after_ms > 0 && f.now_ms - since >= f.park_after_ms) {
      // Parked once: the first writer of parked_at wins.
      IDEM_ASSIGN_OR_RETURN(bool parked, CallIf("UpdateItem",
                                                {{"TableName", table_},
                                                 {"Key", fkey},
                                                 {"UpdateExpression", "SET parked_at = :t"},
                                                 {"ConditionExpression", "attribute_not_exists(parked_at)"},
                                                 {"ExpressionAttributeValues", {{":t", N(f.now_ms)}}}},
                                                what));
      if (parked) {
        IDEM_RETURN_IF_ERROR(dead_letter("parked", "in progress since " + std::to_string(since) + " ms: " + f.error));
        count.parked = true;
      }
    }
  } else if (f.kind == Kind::kCrashLoop ||
             (f.kind == Kind::kFailed && f.max_attempts > 0 && count.attempts >= f.max_attempts)) {
    count.dead_lettered = true;
    IDEM_RETURN_IF_ERROR(dead_letter("failed", f.error));
  }
  return count;
}

Status DdbStore::ClearFailures(std::string_view consumer, std::string_view id) {
  const std::string what = "DynamoDB failure count of '" + std::string(id) + "' in table '" + table_ + "'";
  IDEM_ASSIGN_OR_RETURN(
      json r, Call("DeleteItem",
                   {{"TableName", table_}, {"Key", Key(FailurePk(consumer), id)}, {"ReturnValues", "ALL_OLD"}}, what));
  if (!r.contains("Attributes") || !r["Attributes"].contains("parked_at")) return Status::OK();
  // A parked message that applied is no longer parked.
  return CallIf("DeleteItem",
                {{"TableName", table_},
                 {"Key", Key(DeadPk(consumer), id)},
                 {"ConditionExpression", "#r = :parked"},
                 {"ExpressionAttributeNames", {{"#r", "reason"}}},
                 {"ExpressionAttributeValues", {{":parked", S("parked")}}}},
                what)
      .status();
}

Result<int64_t> DdbStore::Purge(std::string_view consumer, int64_t before_ms, int batch_size) {
  if (batch_size < 1) return Status::InvalidArgument("purge batch size must be at least 1");
  Forget();  // a purged marker is forgotten here too
  int64_t total = 0;
  for (;;) {
    // Markers are never rewritten (a Put conditioned on their absence), so
    // one read before deleting is enough; each round reads afresh and
    // checks the cut again.
    IDEM_ASSIGN_OR_RETURN(std::vector<json> all,
                          ReadAll(consumer.empty() ? "" : MarkerPk(consumer), "m|", "#k, sk, #at"));
    std::vector<json> keys;
    for (const json& m : all) {
      if (GetN(m, "at") >= before_ms) continue;
      keys.push_back({{"pk", m["pk"]}, {"sk", m["sk"]}});
      if (keys.size() == static_cast<size_t>(batch_size)) break;
    }
    IDEM_RETURN_IF_ERROR(DeleteKeys(keys));
    total += static_cast<int64_t>(keys.size());
    if (keys.size() < static_cast<size_t>(batch_size)) return total;
    IDEM_KILL_POINT("store.purge_batch");
  }
}

Result<int64_t> DdbStore::CountMarkers(std::string_view consumer) {
  IDEM_ASSIGN_OR_RETURN(std::vector<json> all, ReadAll(consumer.empty() ? "" : MarkerPk(consumer), "m|", "#k"));
  return static_cast<int64_t>(all.size());
}

Result<std::vector<Marker>> DdbStore::ListMarkers(std::string_view consumer, int limit) {
  IDEM_RETURN_IF_ERROR(CheckLimit(limit));
  IDEM_ASSIGN_OR_RETURN(std::vector<json> all, ReadAll(consumer.empty() ? "" : MarkerPk(consumer), "m|", nullptr));
  std::vector<Marker> out;
  for (const json& m : all) {
    IDEM_ASSIGN_OR_RETURN(std::string id, Unbase64(m["sk"]["B"].get<std::string>()));
    out.push_back(Marker{GetS(m, "pk").substr(2), std::move(id), ToFp(GetB(m, "fp")), GetN(m, "at")});
  }
  NewestFirst(out, &Marker::processed_at_ms, limit);
  return out;
}

Result<std::vector<DeadLetter>> DdbStore::ListDeadLetters(std::string_view consumer, int limit) {
  IDEM_RETURN_IF_ERROR(CheckLimit(limit));
  IDEM_ASSIGN_OR_RETURN(std::vector<json> all, ReadAll(consumer.empty() ? "" : DeadPk(consumer), "d|", nullptr));
  std::vector<DeadLetter> out;
  for (const json& d : all) {
    IDEM_ASSIGN_OR_RETURN(std::string id, Unbase64(d["sk"]["B"].get<std::string>()));
    out.push_back(DeadLetter{GetS(d, "pk").substr(2), std::move(id), GetS(d, "reason"), GetS(d, "error"),
                             static_cast<int>(GetN(d, "attempts")), GetB(d, "payload"), GetN(d, "at")});
  }
  NewestFirst(out, &DeadLetter::at_ms, limit);
  return out;
}

Status DdbStore::MakeTable(const std::string& name, const std::string& hash, const std::string& range, bool emptied) {
  const std::string what = "DynamoDB table '" + name + "'";
  if (emptied) {
    IDEM_ASSIGN_OR_RETURN(aws_internal::Reply d, client_->Call("DeleteTable", {{"TableName", name}}));
    if (d.error && d.error->type != "ResourceNotFoundException")
      return aws_internal::ToStatus(*d.error, "delete " + what);
    for (int i = 0; !d.error; ++i) {  // gone once DescribeTable says so
      IDEM_ASSIGN_OR_RETURN(d, client_->Call("DescribeTable", {{"TableName", name}}));
      if (i == 600) return Status::Unavailable(what + " is still being deleted after 60 s");
      if (!d.error) env_->SleepMs(100);
    }
  }
  json create = {
      {"TableName", name},
      {"AttributeDefinitions",
       {{{"AttributeName", hash}, {"AttributeType", "S"}}, {{"AttributeName", range}, {"AttributeType", "S"}}}},
      {"KeySchema", {{{"AttributeName", hash}, {"KeyType", "HASH"}}, {{"AttributeName", range}, {"KeyType", "RANGE"}}}},
      {"BillingMode", "PAY_PER_REQUEST"}};
  IDEM_ASSIGN_OR_RETURN(aws_internal::Reply c, client_->Call("CreateTable", create));
  if (c.error && c.error->type != "ResourceInUseException") return aws_internal::ToStatus(*c.error, "create " + what);
  for (int i = 0;; ++i) {
    IDEM_ASSIGN_OR_RETURN(json t, Call("DescribeTable", {{"TableName", name}}, "describe " + what));
    if (t["Table"].value("TableStatus", std::string()) == "ACTIVE") return Status::OK();
    if (i == 600) return Status::Unavailable(what + " was created but is not ACTIVE after 60 s");
    env_->SleepMs(100);
  }
}

Result<std::vector<json>> DdbStore::ScanTable(const std::string& name) {
  std::vector<json> out;
  json in = {{"TableName", name}, {"ConsistentRead", true}};
  for (;;) {
    IDEM_ASSIGN_OR_RETURN(json r, Call("Scan", in, "DynamoDB Scan of table '" + name + "'"));
    for (auto& item : r["Items"]) out.push_back(std::move(item));
    if (!r.contains("LastEvaluatedKey")) return out;
    in["ExclusiveStartKey"] = r["LastEvaluatedKey"];
  }
}

Status DdbStore::ForgetFailures(std::string_view consumer) {
  std::vector<json> keys;
  for (const std::string& pk : {FailurePk(consumer), DeadPk(consumer)}) {
    IDEM_ASSIGN_OR_RETURN(std::vector<json> items, ReadAll(pk, "", "#k, sk"));
    for (const json& item : items) keys.push_back({{"pk", item["pk"]}, {"sk", item["sk"]}});
  }
  return DeleteKeys(keys);
}

Result<Store::SchemaInfo> DdbStore::Schema() {
  SchemaInfo info;
  info.version = 1;
  info.statements = {
      "CreateTable " + table_ + ": pk (S, HASH), sk (B, RANGE), BillingMode PAY_PER_REQUEST",
      "UpdateTimeToLive " + table_ + ": expires_at",
      "idem_markers: pk = 'm|<consumer>', sk = id; fp (B), at (N, ms), expires_at (N, s: with marker_ttl_s)",
      "idem_failures: pk = 'f|<consumer>', sk = id; attempts, last_error, updated_at, in_progress_since, parked_at",
      "idem_dead_letters: pk = 'd|<consumer>', sk = id; reason, error, attempts, payload (B), at",
      "idem_claims: pk = 'c|<scope>', sk = key; state, fp, fence, lease_until, done_until, result (B), is_error,"
      " updated_at",
      "idem_claim_fence: pk = 'fence', sk = 'n'; v (N)",
  };
  return info;
}

Status DdbStore::CheckTable(bool create_if_missing) {
  const std::string where =
      "DynamoDB table '" + table_ + "' at " + client_->endpoint() + " (region " + client_->region() + ")";
  IDEM_ASSIGN_OR_RETURN(aws_internal::Reply d, client_->Call("DescribeTable", {{"TableName", table_}}));
  if (d.error && d.error->type == "ResourceNotFoundException") {
    if (!create_if_missing)
      return Status::NotFound(where +
                              " does not exist (and create_if_missing is off: create it, or open with"
                              " create_if_missing=true)");
    json create = {
        {"TableName", table_},
        {"AttributeDefinitions",
         {{{"AttributeName", "pk"}, {"AttributeType", "S"}}, {{"AttributeName", "sk"}, {"AttributeType", "B"}}}},
        {"KeySchema",
         {{{"AttributeName", "pk"}, {"KeyType", "HASH"}}, {{"AttributeName", "sk"}, {"KeyType", "RANGE"}}}},
        {"BillingMode", "PAY_PER_REQUEST"}};
    IDEM_ASSIGN_OR_RETURN(aws_internal::Reply c, client_->Call("CreateTable", create));
    if (c.error && c.error->type != "ResourceInUseException")
      return aws_internal::ToStatus(*c.error, "create " + where);
    // A new table is CREATING for a while on the service.
    for (int i = 0;; ++i) {
      IDEM_ASSIGN_OR_RETURN(json t, Call("DescribeTable", {{"TableName", table_}}, "describe " + where));
      if (t["Table"].value("TableStatus", std::string()) == "ACTIVE") break;
      if (i == 600) return Status::Unavailable(where + " was created but is not ACTIVE after 60 s");
      env_->SleepMs(100);
    }
    IDEM_ASSIGN_OR_RETURN(aws_internal::Reply ttl,
                          client_->Call("UpdateTimeToLive", {{"TableName", table_},
                                                             {"TimeToLiveSpecification",
                                                              {{"AttributeName", "expires_at"}, {"Enabled", true}}}}));
    if (ttl.error && ttl.error->message.find("already enabled") == std::string::npos)
      return aws_internal::ToStatus(*ttl.error, "enable TTL on " + where);
    return Status::OK();
  }
  if (d.error) return aws_internal::ToStatus(*d.error, "describe " + where);
  // The key must be idem's.
  std::set<std::string> key;
  for (const json& k : d.body["Table"]["KeySchema"])
    key.insert(k.value("AttributeName", "") + "/" + k.value("KeyType", ""));
  std::set<std::string> types;
  for (const json& a : d.body["Table"]["AttributeDefinitions"])
    types.insert(a.value("AttributeName", "") + ":" + a.value("AttributeType", ""));
  if (key != std::set<std::string>{"pk/HASH", "sk/RANGE"} || !types.count("pk:S") || !types.count("sk:B"))
    return Status::SchemaMismatch(where + " is not idem's: its key must be pk (S, HASH) and sk (B, RANGE)");
  return Status::OK();
}

Result<std::unique_ptr<DdbStore>> DdbStore::Make(const dynamodb::Store::Options& o) {
  const size_t n = o.table.size();
  if (n < 3 || n > 255 || !std::all_of(o.table.begin(), o.table.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '_' || c == '-' || c == '.';
      }))
    return Status::InvalidArgument("DynamoDB table name '" + o.table +
                                   "': 3 to 255 of the characters a-z, A-Z, 0-9, '_', '-', '.'");
  if (o.marker_ttl_s < 0) return Status::InvalidArgument("marker_ttl_s must be >= 0");
  if (o.max_attempts < 1 || o.max_attempts > 20) return Status::InvalidArgument("max_attempts must be 1..20");
  if (o.pool_size < 1) return Status::InvalidArgument("pool_size must be >= 1");
  aws_internal::CredentialQuery q;
  q.profile = o.profile;
  q.given.access_key_id = o.access_key_id;
  q.given.secret_access_key = o.secret_access_key;
  aws_internal::ClientOptions c;
  IDEM_ASSIGN_OR_RETURN(c.credentials, aws_internal::FindCredentials(q));
  IDEM_ASSIGN_OR_RETURN(c.region, aws_internal::FindRegion(o.region, q));
  c.endpoint = o.endpoint;
  c.max_attempts = o.max_attempts;
  c.pool_size = o.pool_size;
  c.env = o.env;
  std::unique_ptr<DdbStore> s(new DdbStore());
  IDEM_ASSIGN_OR_RETURN(
      s->client_, aws_internal::JsonClient::Open({"dynamodb", "DynamoDB_20120810", "application/x-amz-json-1.0"}, c));
  s->table_ = o.table;
  s->env_ = o.env != nullptr ? o.env : Env::Default();
  s->claim_clock_ = o.claim_clock != nullptr ? o.claim_clock : s->env_;
  s->marker_ttl_s_ = o.marker_ttl_s;
  IDEM_RETURN_IF_ERROR(s->CheckTable(o.create_if_missing));
  return s;
}

}  // namespace idem::dynamodb_internal

namespace idem::dynamodb {

Result<std::unique_ptr<idem::Store>> Store::Open(const Options& options) {
  IDEM_ASSIGN_OR_RETURN(auto s, dynamodb_internal::DdbStore::Make(options));
  return std::unique_ptr<idem::Store>(std::move(s));
}

Result<Store::Options> Store::ParseUrl(std::string_view url) {
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(url, "DynamoDB store URL"));
  if (u.scheme != "dynamodb" || u.hosts.size() != 1 || u.hosts[0].port != 0 || !u.path.empty() || u.has_user)
    return Status::InvalidArgument("not a DynamoDB store URL (dynamodb://TABLE?region=..&endpoint=..): " +
                                   RedactUrl(url));
  IDEM_RETURN_IF_ERROR(
      u.CheckKeys({"region", "endpoint", "profile", "create_if_missing", "marker_ttl_s", "max_attempts", "pool_size"}));
  Options o;
  o.table = u.hosts[0].host;
  o.region = u.Get("region");
  o.endpoint = u.Get("endpoint");
  o.profile = u.Get("profile");
  IDEM_ASSIGN_OR_RETURN(o.create_if_missing, u.GetBool("create_if_missing", o.create_if_missing));
  IDEM_ASSIGN_OR_RETURN(o.marker_ttl_s, u.GetInt("marker_ttl_s", o.marker_ttl_s, 0, int64_t{10} * 365 * 86'400));
  IDEM_ASSIGN_OR_RETURN(int64_t attempts, u.GetInt("max_attempts", o.max_attempts, 1, 20));
  IDEM_ASSIGN_OR_RETURN(int64_t pool, u.GetInt("pool_size", o.pool_size, 1, 1024));
  o.max_attempts = static_cast<int>(attempts);
  o.pool_size = static_cast<int>(pool);
  return o;
}

}  // namespace idem::dynamodb
