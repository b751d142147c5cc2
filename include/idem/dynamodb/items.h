// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// What a handler writes on the DynamoDB store (idem/dynamodb/store.h):
// items, not SQL. The Inbox hands the handler an idem::Transaction; on this
// store ItemsOf(tx) is its key-value view. Every write is queued and sent at
// commit in one TransactWriteItems call together with the message's marker
// (a Put conditioned on attribute_not_exists), so the items and the marker
// commit together or not at all.
//
//   inbox->Handle(msg, [](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
//     idem::dynamodb::Items& items = idem::dynamodb::ItemsOf(tx);
//     using idem::dynamodb::Attr;
//     IDEM_RETURN_IF_ERROR(items.Put("payments", {{"order", Attr::S(m.id)}, {"cents", Attr::N(4000)}}));
//     return items.Update("accounts", {{"id", Attr::S("acc-1")}}, "SET balance = balance - :c",
//                         {.expression = "balance >= :c", .values = {{":c", Attr::N(4000)}}});
//   });
//
// Limits (DynamoDB's): at most 100 writes per transaction, the markers of
// the transaction included (a batch of n messages leaves 100 - n for the
// items); one write per item per transaction. A condition that fails at
// commit cancels the whole transaction: the commit's error names the
// table and the item's place, and nothing is written.
//
// Reads: Get is a strongly consistent GetItem of the table as committed; it
// does not see this transaction's own queued writes, and it is not
// isolated from other writers (guard what must not change with a
// ConditionCheck or a condition on the write).
//
// Thread safety: as the transaction's (one thread at a time).
#ifndef IDEM_DYNAMODB_ITEMS_H_
#define IDEM_DYNAMODB_ITEMS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "idem/result.h"
#include "idem/status.h"
#include "idem/transaction.h"

namespace idem::dynamodb {

// One attribute value, typed as DynamoDB's JSON types it: S, N, B, BOOL,
// NULL, or any other (L, M, SS, NS, BS) as its JSON text.
class Attr {
 public:
  enum class Type { kS, kN, kB, kBool, kNull, kJson };
  static Attr S(std::string text) { return Attr(Type::kS, std::move(text)); }
  static Attr N(int64_t n) { return Attr(Type::kN, std::to_string(n)); }
  // A number as its decimal text ("12.50"), as DynamoDB keeps it.
  static Attr Number(std::string decimal) { return Attr(Type::kN, std::move(decimal)); }
  static Attr B(std::string bytes) { return Attr(Type::kB, std::move(bytes)); }
  static Attr Bool(bool b) { return Attr(Type::kBool, b ? "true" : "false"); }
  static Attr Null() { return Attr(Type::kNull, ""); }
  // Any attribute value in DynamoDB's JSON, e.g. {"L":[{"S":"a"}]} or
  // {"SS":["a","b"]}; checked when the write is queued.
  static Attr Json(std::string json) { return Attr(Type::kJson, std::move(json)); }

  Type type() const { return type_; }
  // S's text, N's decimal text, B's bytes, "true"/"false", "" for NULL, or
  // the JSON of any other type.
  const std::string& text() const { return text_; }
  // N as an integer (0 if it is not one, or not an N).
  int64_t AsInt() const;
  bool operator==(const Attr& o) const = default;

 private:
  Attr(Type t, std::string text) : type_(t), text_(std::move(text)) {}
  Type type_ = Type::kNull;
  std::string text_;
};

// An item, or an item's key: attribute name -> value.
using Item = std::map<std::string, Attr, std::less<>>;

// A condition on a write (ConditionExpression), and the placeholders the
// condition and an update expression use: "#n" names, ":v" values.
struct Condition {
  std::string expression{};                                 // "" for none; "attribute_not_exists(id)", "balance >= :c"
  std::map<std::string, std::string, std::less<>> names{};  // "#s" -> "status"
  Item values{};                                            // ":c" -> Attr::N(4000)
};

// The key-value view of an open transaction on the DynamoDB store. Writes
// are queued and committed with the marker (see the top of this file);
// each returns kInvalidArgument at once for a write that can never commit
// (an empty table name or item, a 101st write, placeholders that do not
// parse).
class Items {
 public:
  virtual ~Items() = default;

  virtual Status Put(std::string_view table, Item item, Condition condition = {}) = 0;
  // `update`: an UpdateExpression ("SET #c = #c + :one REMOVE pending"),
  // its placeholders in `condition` (whose expression may be empty).
  virtual Status Update(std::string_view table, Item key, std::string_view update, Condition condition = {}) = 0;
  virtual Status Delete(std::string_view table, Item key, Condition condition = {}) = 0;
  // Writes nothing; cancels the transaction at commit unless it holds.
  virtual Status ConditionCheck(std::string_view table, Item key, Condition condition) = 0;
  // A strongly consistent read of the committed item (std::nullopt: none).
  virtual Result<std::optional<Item>> Get(std::string_view table, const Item& key) = 0;
  // Writes queued so far, the markers included (at most 100).
  virtual int Queued() const = 0;

 protected:
  Items() = default;
};

// The key-value view of `tx`, the transaction the Inbox (or Store::Begin)
// of a DynamoDB store gave. For any other store's transaction, an Items
// whose every call fails with kInvalidArgument saying so.
Items& ItemsOf(Transaction& tx);

}  // namespace idem::dynamodb

#endif  // IDEM_DYNAMODB_ITEMS_H_
