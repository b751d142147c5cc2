// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The payments workload's effect (payments.h): its message, and the rows (SQL
// stores) or items (DynamoDB) it writes, resets and reads. Built in every
// configuration of the command (the HTTP parts are in payments.cc).
#include <cstdlib>

#include "idem/env.h"
#include "payments.h"

#if IDEM_HAVE_DYNAMODB
#include <unistd.h>

#include <atomic>
#include <random>

#include "dynamodb/ddb.h"
#endif

namespace idem::cli {

std::string PaymentPayload(const std::string& order, int64_t cents) { return order + ":" + std::to_string(cents); }

Result<std::pair<std::string, int64_t>> ParsePayment(const Message& m) {
  auto colon = m.payload.find(':');
  if (colon == std::string::npos || colon == 0)
    return Status::InvalidArgument("malformed payment payload '" + m.payload + "' (want ORDER:CENTS)");
  char* end = nullptr;
  long long cents = std::strtoll(m.payload.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || cents <= 0) return Status::InvalidArgument("malformed amount in payload '" + m.payload + "'");
  return std::make_pair(m.payload.substr(0, colon), static_cast<int64_t>(cents));
}

Message PaymentMessage(const std::string& id, const std::string& order, int64_t cents) {
  Message m;
  m.id = id;
  m.payload = PaymentPayload(order, cents);
  m.producer_time_ms = Env::Default()->NowMs();
  return m;
}

std::string CreatePaymentsSql(const std::string& table) {
  return "CREATE TABLE IF NOT EXISTS " + table +
         "(order_id TEXT NOT NULL, message_id TEXT NOT NULL, cents INTEGER NOT NULL, charge_id TEXT)";
}

#if IDEM_HAVE_DYNAMODB
namespace {
// On DynamoDB the effect is an item of the table (in the account and region
// of the store), keyed (message_id, row): a row id of its own per write, so
// that a second application shows as a second item.
namespace ddb = dynamodb_internal;
ddb::DdbStore* DynamoOf(Store& store) { return dynamic_cast<ddb::DdbStore*>(&store); }
std::string NewRowId() {
  static std::atomic<uint64_t> n{std::random_device{}()};
  return std::to_string(::getpid()) + "-" + std::to_string(n++);
}
}  // namespace
#endif

Status InsertPayment(Transaction& tx, const Message& m, const std::string& charge_id, const std::string& table) {
  IDEM_ASSIGN_OR_RETURN(auto p, ParsePayment(m));
#if IDEM_HAVE_DYNAMODB
  if (dynamodb::Items* items = ddb::ItemsIn(tx)) {
    using dynamodb::Attr;
    dynamodb::Item item = {{"message_id", Attr::S(m.id)},
                           {"row", Attr::S(NewRowId())},
                           {"order_id", Attr::S(p.first)},
                           {"cents", Attr::N(p.second)}};
    if (!charge_id.empty()) item.emplace("charge_id", Attr::S(charge_id));
    return items->Put(table, std::move(item));
  }
#endif
  return tx
      .Exec("INSERT INTO " + table + "(order_id, message_id, cents, charge_id) VALUES ($1, $2, $3, $4)",
            {p.first, m.id, p.second, charge_id.empty() ? Value() : Value(charge_id)})
      .status();
}

Status ResetPayments(Store& store, const std::string& table) {
#if IDEM_HAVE_DYNAMODB
  if (ddb::DdbStore* d = DynamoOf(store)) return d->MakeTable(table, "message_id", "row", /*emptied=*/true);
#endif
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  for (const std::string& sql : {"DROP TABLE IF EXISTS " + table, CreatePaymentsSql(table)})
    IDEM_RETURN_IF_ERROR(tx->Exec(sql).status());
  return tx->Commit();
}

Status EnsurePayments(Store& store, const std::string& table) {
#if IDEM_HAVE_DYNAMODB
  if (ddb::DdbStore* d = DynamoOf(store)) return d->MakeTable(table, "message_id", "row", /*emptied=*/false);
#endif
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec(CreatePaymentsSql(table)).status());
  return tx->Commit();
}

Result<std::vector<PaymentRow>> ReadPayments(Store& store, const std::string& table, const std::string& message_id) {
#if IDEM_HAVE_DYNAMODB
  if (ddb::DdbStore* d = DynamoOf(store)) {
    IDEM_ASSIGN_OR_RETURN(std::vector<ddb::json> items, d->ScanTable(table));
    std::vector<PaymentRow> out;
    for (const ddb::json& item : items) {
      if (!message_id.empty() && ddb::GetS(item, "message_id") != message_id) continue;
      out.push_back({.order_id = ddb::GetS(item, "order_id"),
                     .message_id = ddb::GetS(item, "message_id"),
                     .charge_id = ddb::GetS(item, "charge_id"),
                     .cents = ddb::GetN(item, "cents")});
    }
    return out;
  }
#endif
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  const std::string sql = "SELECT order_id, message_id, charge_id, cents FROM " + table;
  IDEM_ASSIGN_OR_RETURN(Rows r,
                        message_id.empty() ? tx->Query(sql) : tx->Query(sql + " WHERE message_id = $1", {message_id}));
  std::vector<PaymentRow> out;
  out.reserve(r.rows.size());
  for (const auto& row : r.rows)
    out.push_back({.order_id = row[0].AsText(),
                   .message_id = row[1].AsText(),
                   .charge_id = row[2].is_null() ? std::string() : row[2].AsText(),
                   .cents = row[3].AsInt()});
  return out;
}

Status ForgetFailures(Store& store, const std::string& consumer) {
#if IDEM_HAVE_DYNAMODB
  if (ddb::DdbStore* d = DynamoOf(store)) return d->ForgetFailures(consumer);
#endif
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  for (const char* table : {"idem_failures", "idem_dead_letters"})
    IDEM_RETURN_IF_ERROR(tx->Exec(std::string("DELETE FROM ") + table + " WHERE consumer = $1", {consumer}).status());
  return tx->Commit();
}

}  // namespace idem::cli
