// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Claims (two-phase mode) on the DynamoDB store. Every step is one
// conditional write: a Put for a new key (attribute_not_exists), or one
// that names the fence and state it saw, so a decision made on a read that
// went stale writes nothing and is made again. Fences come from one counter
// item (UpdateItem ADD): unique and growing across the table. Time is the
// store's clock option (DynamoDB has no server clock to read).
#include <algorithm>

#include "core/claim_rules.h"
#include "dynamodb/ddb.h"

namespace idem::dynamodb_internal {
namespace {

constexpr int kInProgress = 0;
constexpr int kCompleted = 1;
constexpr int kMaxRounds = 16;

}  // namespace

std::string ClaimPk(std::string_view scope) { return "c|" + std::string(scope); }

ClaimRecord ToClaimRecord(const json& item) {
  ClaimRecord c;
  c.scope = GetS(item, "pk").substr(2);
  c.key = GetB(item, "sk");
  c.state = GetN(item, "state") == kCompleted ? ClaimRecord::State::kCompleted : ClaimRecord::State::kInProgress;
  c.fingerprint = ToFp(GetB(item, "fp"));
  c.fence = GetN(item, "fence");
  c.lease_until_ms = GetN(item, "lease_until");
  c.expires_at_ms = GetN(item, "done_until");
  c.result = GetB(item, "result");
  c.result_is_error = GetN(item, "is_error") != 0;
  c.updated_at_ms = GetN(item, "updated_at");
  return c;
}

Result<int64_t> DdbStore::NextFence() {
  IDEM_ASSIGN_OR_RETURN(json r, Call("UpdateItem",
                                     {{"TableName", table_},
                                      {"Key", Key("fence", "n")},
                                      {"UpdateExpression", "ADD v :one"},
                                      {"ExpressionAttributeValues", {{":one", N(1)}}},
                                      {"ReturnValues", "UPDATED_NEW"}},
                                     "DynamoDB claims' fence counter in table '" + table_ + "'"));
  return GetN(r["Attributes"], "v");
}

json DdbStore::ClaimPut(const ClaimRequest& r, int64_t fence, int64_t now, const json& seen) {
  json item = Key(ClaimPk(r.scope), r.key);
  item["state"] = N(kInProgress);
  item["fp"] = B(std::string(reinterpret_cast<const char*>(r.fingerprint.data()), r.fingerprint.size()));
  item["fence"] = N(fence);
  item["lease_until"] = N(now + r.lease_ms);
  item["updated_at"] = N(now);
  json put = {{"TableName", table_}, {"Item", std::move(item)}};
  if (seen.is_null()) {
    put["ConditionExpression"] = "attribute_not_exists(pk)";
  } else {
    put["ConditionExpression"] = "fence = :f AND #st = :s";
    put["ExpressionAttributeNames"] = {{"#st", "state"}};
    put["ExpressionAttributeValues"] = {{":f", N(GetN(seen, "fence"))}, {":s", N(GetN(seen, "state"))}};
  }
  return put;
}

Result<ClaimOutcome> DdbStore::TryClaim(const ClaimRequest& r) {
  for (int round = 0; round < kMaxRounds; ++round) {
    const int64_t now = claim_clock_->NowMs();
    IDEM_ASSIGN_OR_RETURN(json seen, GetRecord(ClaimPk(r.scope), r.key));
    bool took_over = false;
    if (!seen.is_null()) {
      const ClaimRecord rec = ToClaimRecord(seen);
      if (auto answered = DecideClaim(rec, r, now)) return std::move(*answered);
      took_over = rec.state == ClaimRecord::State::kInProgress;
    }
    IDEM_ASSIGN_OR_RETURN(int64_t fence, NextFence());
    IDEM_ASSIGN_OR_RETURN(bool written, CallIf("PutItem", ClaimPut(r, fence, now, seen),
                                               "DynamoDB claim of '" + r.key + "' in table '" + table_ + "'"));
    if (written) return StartedClaim(r, fence, now + r.lease_ms, took_over);
  }
  return Status::Busy("claim of key '" + r.key + "' in scope '" + r.scope + "' lost " + std::to_string(kMaxRounds) +
                      " races in a row; retry");
}

Result<std::optional<ClaimOutcome>> DdbStore::Peek(const ClaimRequest& r) {
  IDEM_ASSIGN_OR_RETURN(json seen, GetRecord(ClaimPk(r.scope), r.key));
  if (seen.is_null()) return std::optional<ClaimOutcome>();
  return DecideClaim(ToClaimRecord(seen), r, claim_clock_->NowMs());
}

Status DdbStore::LeaseLost(const ClaimToken& t, bool completed_ok) {
  IDEM_ASSIGN_OR_RETURN(auto rec, FindClaim(t.scope, t.key));
  return internal::LeaseLostFor(t, rec, completed_ok);
}

namespace {
// The condition every write of a holder carries: its fence, in progress.
json Held(json op, const ClaimToken& t) {
  op["ConditionExpression"] = "fence = :f AND #st = :prog";
  op["ExpressionAttributeNames"]["#st"] = "state";
  op["ExpressionAttributeValues"][":f"] = N(t.fence);
  op["ExpressionAttributeValues"][":prog"] = N(kInProgress);
  return op;
}
}  // namespace

Status DdbStore::Complete(const ClaimToken& t, std::string_view result, bool is_error, int64_t retention_ms) {
  const int64_t now = claim_clock_->NowMs();
  json op = {
      {"TableName", table_},
      {"Key", Key(ClaimPk(t.scope), t.key)},
      {"UpdateExpression", "SET #st = :done, #res = :res, is_error = :err, done_until = :exp, updated_at = :now"},
      {"ExpressionAttributeNames", {{"#res", "result"}}},
      {"ExpressionAttributeValues",
       {{":done", N(kCompleted)},
        {":res", B(result)},
        {":err", N(is_error ? 1 : 0)},
        {":exp", N(now + retention_ms)},
        {":now", N(now)}}}};
  IDEM_ASSIGN_OR_RETURN(
      bool done, CallIf("UpdateItem", Held(std::move(op), t), "DynamoDB completion of " + DescribeClaimToken(t)));
  if (!done) return LeaseLost(t, /*completed_ok=*/true);
  NotifyChanged(t.scope, t.key);
  return Status::OK();
}

Status DdbStore::Release(const ClaimToken& t) {
  json op = {{"TableName", table_}, {"Key", Key(ClaimPk(t.scope), t.key)}};
  IDEM_ASSIGN_OR_RETURN(bool done,
                        CallIf("DeleteItem", Held(std::move(op), t), "DynamoDB release of " + DescribeClaimToken(t)));
  if (!done) return LeaseLost(t, /*completed_ok=*/false);
  NotifyChanged(t.scope, t.key);
  return Status::OK();
}

Result<int64_t> DdbStore::Extend(const ClaimToken& t, int64_t lease_ms) {
  const int64_t now = claim_clock_->NowMs();
  json op = {{"TableName", table_},
             {"Key", Key(ClaimPk(t.scope), t.key)},
             {"UpdateExpression", "SET lease_until = :l, updated_at = :now"},
             {"ExpressionAttributeValues", {{":l", N(now + lease_ms)}, {":now", N(now)}}}};
  IDEM_ASSIGN_OR_RETURN(bool done,
                        CallIf("UpdateItem", Held(std::move(op), t), "DynamoDB extension of " + DescribeClaimToken(t)));
  if (!done) {
    Status s = LeaseLost(t, /*completed_ok=*/false);
    return s.ok() ? Status::Internal("extend changed nothing") : s;
  }
  return now + lease_ms;
}

Result<std::optional<ClaimRecord>> DdbStore::FindClaim(std::string_view scope, std::string_view key) {
  IDEM_ASSIGN_OR_RETURN(json seen, GetRecord(ClaimPk(scope), key));
  if (seen.is_null()) return std::optional<ClaimRecord>();
  return std::optional<ClaimRecord>(ToClaimRecord(seen));
}

Result<std::vector<ClaimRecord>> DdbStore::ListClaims(std::string_view scope, int limit) {
  if (limit < 0) return Status::InvalidArgument("a list limit cannot be negative, got " + std::to_string(limit));
  IDEM_ASSIGN_OR_RETURN(std::vector<json> all, ReadAll(scope.empty() ? "" : ClaimPk(scope), "c|", nullptr));
  std::vector<ClaimRecord> out;
  for (const json& item : all) out.push_back(ToClaimRecord(item));
  NewestFirst(out, &ClaimRecord::updated_at_ms, limit);
  return out;
}

Result<int64_t> DdbStore::CountClaims(std::string_view scope) {
  IDEM_ASSIGN_OR_RETURN(std::vector<json> all, ReadAll(ClaimPk(scope), "", "#k"));
  return static_cast<int64_t>(all.size());
}

Result<int64_t> DdbStore::PurgeClaims(std::string_view scope, int64_t abandoned_after_ms, int batch_size) {
  if (batch_size < 1) return Status::InvalidArgument("purge batch size must be at least 1");
  const int64_t now = claim_clock_->NowMs();
  IDEM_ASSIGN_OR_RETURN(std::vector<json> all, ReadAll(scope.empty() ? "" : ClaimPk(scope), "c|", nullptr));
  int64_t total = 0;
  for (const json& item : all) {
    const ClaimRecord rec = ToClaimRecord(item);
    const bool gone = rec.state == ClaimRecord::State::kCompleted ? rec.expires_at_ms <= now
                                                                  : rec.lease_until_ms + abandoned_after_ms <= now;
    if (!gone) continue;
    // Only the record as read: a key claimed again since keeps its new one.
    IDEM_ASSIGN_OR_RETURN(bool deleted,
                          CallIf("DeleteItem",
                                 {{"TableName", table_},
                                  {"Key", {{"pk", item["pk"]}, {"sk", item["sk"]}}},
                                  {"ConditionExpression", "fence = :f AND updated_at = :u"},
                                  {"ExpressionAttributeValues", {{":f", N(rec.fence)}, {":u", N(rec.updated_at_ms)}}}},
                                 "DynamoDB purge of claims in table '" + table_ + "'"));
    total += deleted ? 1 : 0;
  }
  return total;
}

}  // namespace idem::dynamodb_internal
