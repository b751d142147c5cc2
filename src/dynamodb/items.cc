// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// Attribute values in DynamoDB's JSON, and ItemsOf.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "dynamodb/ddb.h"

namespace idem::dynamodb {

int64_t Attr::AsInt() const {
  if (type_ != Type::kN) return 0;
  char* end = nullptr;
  const long long v = std::strtoll(text_.c_str(), &end, 10);
  return end != nullptr && *end == '\0' ? v : 0;
}

namespace {

// The live transactions of this process, by their NativeHandle: ItemsOf
// finds the one under a wrapper (idem::testing's harness wraps them).
std::mutex live_mu;
std::set<const void*>& Live() {
  static auto* live = new std::set<const void*>;
  return *live;
}

// ItemsOf a transaction of another store: every call says so.
class NotDynamo final : public Items {
 public:
  Status Put(std::string_view, Item, Condition) override { return Refuse(); }
  Status Update(std::string_view, Item, std::string_view, Condition) override { return Refuse(); }
  Status Delete(std::string_view, Item, Condition) override { return Refuse(); }
  Status ConditionCheck(std::string_view, Item, Condition) override { return Refuse(); }
  Result<std::optional<Item>> Get(std::string_view, const Item&) override { return Refuse(); }
  int Queued() const override { return 0; }

 private:
  static Status Refuse() {
    return Status::InvalidArgument(
        "idem::dynamodb::ItemsOf: this transaction is not a DynamoDB store's (use Exec/Query on a SQL store)");
  }
};

}  // namespace

Items& ItemsOf(Transaction& tx) {
  if (Items* items = dynamodb_internal::ItemsIn(tx)) return *items;
  static NotDynamo refusing;
  return refusing;
}

}  // namespace idem::dynamodb

namespace idem::dynamodb_internal {

dynamodb::Items* ItemsIn(Transaction& tx) {
  if (auto* items = dynamic_cast<dynamodb::Items*>(&tx)) return items;
  void* handle = tx.NativeHandle();
  std::lock_guard<std::mutex> l(dynamodb::live_mu);
  return dynamodb::Live().count(handle) != 0 ? static_cast<dynamodb::Items*>(handle) : nullptr;
}

void RegisterLive(const void* handle, bool live) {
  std::lock_guard<std::mutex> l(dynamodb::live_mu);
  if (live) {
    dynamodb::Live().insert(handle);
  } else {
    dynamodb::Live().erase(handle);
  }
}

namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
}

std::string Base64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out += kAlphabet[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

Result<std::string> Unbase64(std::string_view in) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=' || c == '\n' || c == '\r') continue;
    const char* p = std::strchr(kAlphabet, c);
    if (c == '\0' || p == nullptr) return Status::Corruption("DynamoDB answered a B value that is not base64");
    acc = (acc << 6) | static_cast<uint32_t>(p - kAlphabet);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

json B(std::string_view bytes) { return {{"B", Base64(bytes)}}; }

int64_t GetN(const json& item, const char* name, int64_t fallback) {
  auto it = item.find(name);
  if (it == item.end() || !it->is_object() || !it->contains("N")) return fallback;
  const std::string& n = (*it)["N"].get_ref<const std::string&>();
  return std::strtoll(n.c_str(), nullptr, 10);
}

std::string GetS(const json& item, const char* name) {
  auto it = item.find(name);
  if (it == item.end() || !it->is_object() || !it->contains("S")) return {};
  return (*it)["S"].get<std::string>();
}

std::string GetB(const json& item, const char* name) {
  auto it = item.find(name);
  if (it == item.end() || !it->is_object() || !it->contains("B")) return {};
  auto bytes = Unbase64((*it)["B"].get_ref<const std::string&>());
  return bytes.ok() ? *bytes : std::string();
}

json Key(std::string_view pk, std::string_view sk) { return {{"pk", S(pk)}, {"sk", B(sk)}}; }

Fingerprint ToFp(const std::string& bytes) {
  Fingerprint fp{};
  std::copy_n(bytes.begin(), std::min(bytes.size(), fp.size()), fp.begin());
  return fp;
}

Result<json> ToJson(const Attr& a) {
  switch (a.type()) {
    case Attr::Type::kS: return json{{"S", a.text()}};
    case Attr::Type::kN: return json{{"N", a.text()}};
    case Attr::Type::kB: return B(a.text());
    case Attr::Type::kBool: return json{{"BOOL", a.text() == "true"}};
    case Attr::Type::kNull: return json{{"NULL", true}};
    case Attr::Type::kJson: {
      json j = json::parse(a.text(), nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || j.size() != 1)
        return Status::InvalidArgument("Attr::Json: not one DynamoDB attribute value ({\"L\": [...]}): " +
                                       a.text().substr(0, 60));
      return j;
    }
  }
  return Status::Internal("unknown Attr type");
}

Result<json> ToJson(const Item& item) {
  json out = json::object();
  for (const auto& [name, value] : item) {
    if (name.empty()) return Status::InvalidArgument("an attribute with an empty name");
    IDEM_ASSIGN_OR_RETURN(out[name], ToJson(value));
  }
  return out;
}

Result<Item> ItemFromJson(const json& j) {
  Item out;
  for (const auto& [name, v] : j.items()) {
    if (!v.is_object() || v.size() != 1) return Status::Corruption("DynamoDB answered a malformed attribute " + name);
    const std::string type = v.begin().key();
    const json& x = v.begin().value();
    if (type == "S" && x.is_string()) {
      out.emplace(name, Attr::S(x.get<std::string>()));
    } else if (type == "N" && x.is_string()) {
      out.emplace(name, Attr::Number(x.get<std::string>()));
    } else if (type == "B" && x.is_string()) {
      IDEM_ASSIGN_OR_RETURN(std::string bytes, Unbase64(x.get_ref<const std::string&>()));
      out.emplace(name, Attr::B(std::move(bytes)));
    } else if (type == "BOOL" && x.is_boolean()) {
      out.emplace(name, Attr::Bool(x.get<bool>()));
    } else if (type == "NULL") {
      out.emplace(name, Attr::Null());
    } else {
      out.emplace(name, Attr::Json(v.dump()));
    }
  }
  return out;
}

}  // namespace idem::dynamodb_internal
