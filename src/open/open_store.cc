// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// OpenStore / OpenClaimStore: SQLite, always; postgres://, dynamodb:// and redis://
// through their openers (src/open/openers.h) when this program links them
// (IDEM_OPEN_HAVE_<COMPONENT>: built into idem::open).
#include <memory>
#include <string>
#include <utility>

#include "idem/open.h"
#include "idem/sqlite/store.h"
#include "idem/url.h"
#include "open/openers.h"

namespace idem {
namespace {

enum class StoreKind { kSqlite, kPostgres, kDynamodb, kRedis, kUnknown };

StoreKind KindOf(std::string_view url) {
  const std::string scheme = UrlScheme(url);
  if (scheme.empty() || scheme == "sqlite") return StoreKind::kSqlite;  // a bare path is a file
  if (scheme == "postgres" || scheme == "postgresql") return StoreKind::kPostgres;
  if (scheme == "redis") return StoreKind::kRedis;
  if (scheme == "dynamodb") return StoreKind::kDynamodb;
  return StoreKind::kUnknown;
}

// `component` as idem::<component> and its -DIDEM_WITH_<OPTION>=ON.
[[maybe_unused]] Status NotBuilt(std::string_view component, std::string_view option, std::string_view url) {
  std::string m = "'";
  m += RedactUrl(url);
  m += "' needs the idem::";
  m += component;
  m += " component, which this installation was built without (configure idem with -DIDEM_WITH_";
  m += option;
  m += "=ON)";
  return Status::InvalidArgument(m);
}

Status NotAStore(std::string_view url) {
  std::string m = "not a store URL: '";
  m += RedactUrl(url);
  m += "' (expected sqlite:PATH or postgres://...)";
  return Status::InvalidArgument(m);
}

// A SQL store's ClaimStore that owns the store it lives in.
class OwningClaimStore final : public ClaimStore {
 public:
  OwningClaimStore(std::unique_ptr<Store> store, ClaimStore& claims) : store_(std::move(store)), c_(claims) {}

  Result<ClaimOutcome> TryClaim(const ClaimRequest& request) override { return c_.TryClaim(request); }
  Status Complete(const ClaimToken& token, std::string_view result, bool is_error, int64_t retention_ms) override {
    return c_.Complete(token, result, is_error, retention_ms);
  }
  std::vector<Result<ClaimOutcome>> TryClaimMany(std::span<const ClaimRequest> requests) override {
    return c_.TryClaimMany(requests);
  }
  std::vector<Status> CompleteMany(std::span<const Completion> completions, int64_t retention_ms) override {
    return c_.CompleteMany(completions, retention_ms);
  }
  Status Release(const ClaimToken& token) override { return c_.Release(token); }
  Result<int64_t> Extend(const ClaimToken& token, int64_t lease_ms) override { return c_.Extend(token, lease_ms); }
  Result<std::optional<ClaimRecord>> FindClaim(std::string_view scope, std::string_view key) override {
    return c_.FindClaim(scope, key);
  }
  Result<std::vector<ClaimRecord>> ListClaims(std::string_view scope, int limit) override {
    return c_.ListClaims(scope, limit);
  }
  Result<std::optional<ClaimOutcome>> Peek(const ClaimRequest& request) override { return c_.Peek(request); }
  Result<int64_t> CountClaims(std::string_view scope) override { return c_.CountClaims(scope); }
  Result<int64_t> PurgeClaims(std::string_view scope, int64_t abandoned_after_ms, int batch_size) override {
    return c_.PurgeClaims(scope, abandoned_after_ms, batch_size);
  }
  Result<int64_t> NowMs() override { return c_.NowMs(); }
  std::unique_ptr<Watch> WatchKey(std::string_view scope, std::string_view key) override {
    return c_.WatchKey(scope, key);
  }
  std::string WriteLockId() const override { return c_.WriteLockId(); }

 private:
  std::unique_ptr<Store> store_;
  ClaimStore& c_;  // store_'s
};

}  // namespace

Result<std::unique_ptr<Store>> OpenStore(std::string_view url) { return OpenStore(url, StoreOptions{}); }

Result<std::unique_ptr<Store>> OpenStore(std::string_view url, const StoreOptions& settings) {
  switch (KindOf(url)) {
    case StoreKind::kSqlite: {
      auto parsed = sqlite::Store::ParseUrl(url);
      // Something that starts like another URL ("mysql:orders") is not a file name.
      if (!parsed.ok() && parsed.status().message().find("expected sqlite:PATH") != std::string::npos)
        return NotAStore(url);
      IDEM_ASSIGN_OR_RETURN(sqlite::Store::Options o, std::move(parsed));
      o.create_if_missing = o.create_if_missing && settings.create_if_missing;
      if (settings.env != nullptr) o.env = settings.env;
      return sqlite::Store::Open(o);
    }
    case StoreKind::kPostgres: {
#if IDEM_OPEN_HAVE_POSTGRES
      if (open_internal::OpenPostgresStore == nullptr) return open_internal::NotLinked("postgres", url);
      return open_internal::OpenPostgresStore(url, settings);
#else
      return NotBuilt("postgres", "POSTGRES", url);
#endif
    }
    case StoreKind::kDynamodb: {
#if IDEM_OPEN_HAVE_DYNAMODB
      if (open_internal::OpenDynamodbStore == nullptr) return open_internal::NotLinked("dynamodb", url);
      return open_internal::OpenDynamodbStore(url, settings);
#else
      return NotBuilt("dynamodb", "DYNAMODB", url);
#endif
    }
    case StoreKind::kRedis:
      return Status::InvalidArgument("'" + RedactUrl(url) +
                                     "' keeps claims only, not markers: open it with OpenClaimStore");
    case StoreKind::kUnknown: break;
  }
  return NotAStore(url);
}

Result<std::unique_ptr<ClaimStore>> OpenClaimStore(std::string_view url) { return OpenClaimStore(url, StoreOptions{}); }

Result<std::unique_ptr<ClaimStore>> OpenClaimStore(std::string_view url, const StoreOptions& settings) {
  if (KindOf(url) == StoreKind::kRedis) {
#if IDEM_OPEN_HAVE_REDIS
    if (open_internal::OpenRedisClaimStore == nullptr) return open_internal::NotLinked("redis", url);
    return open_internal::OpenRedisClaimStore(url, settings);
#else
    return NotBuilt("redis", "REDIS", url);
#endif
  }
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, OpenStore(url, settings));
  ClaimStore* claims = store->claim_store();
  if (claims == nullptr)
    return Status::InvalidArgument(std::string(store->Kind()) + " store keeps no claims: '" + RedactUrl(url) + "'");
  return std::unique_ptr<ClaimStore>(new OwningClaimStore(std::move(store), *claims));
}

std::vector<std::string> StoreSchemes() {
  std::vector<std::string> out = {"sqlite"};
  if (open_internal::OpenPostgresStore != nullptr) {
    out.push_back("postgres");
    out.push_back("postgresql");
  }
  if (open_internal::OpenDynamodbStore != nullptr) out.push_back("dynamodb");
  if (open_internal::OpenRedisClaimStore != nullptr) out.push_back("redis");
  return out;
}

}  // namespace idem
