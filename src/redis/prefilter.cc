// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/redis/prefilter.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "redis/client.h"
#include "redis/url_options.h"

namespace idem::redis {
namespace {

using Options = Prefilter::Options;

using redis_internal::Pool;
using redis_internal::ReplyPtr;

std::string FingerprintBytes(std::string_view payload) {
  Fingerprint fp = FingerprintOf(payload);
  return std::string(reinterpret_cast<const char*>(fp.data()), fp.size());
}

class RedisPrefilter final : public Prefilter {
 public:
  RedisPrefilter(const Options& o, redis_internal::Endpoint ep)
      : options_(o),
        pool_(std::move(ep), {.connect = {.connect_timeout_ms = o.connect_timeout_ms,
                                          .command_timeout_ms = o.command_timeout_ms,
                                          .client_name = o.client_name},
                              .size = std::max(1, o.pool_size),
                              .retry_after_ms = std::max(0, o.retry_after_ms)}) {}

  // One MGET for the whole delivery. Anything but the exact fingerprint
  // (nil, another payload's, an error) answers "unknown": the store decides.
  std::vector<bool> KnownApplied(std::string_view consumer, std::span<const Message> messages) override {
    std::vector<bool> known(messages.size(), false);
    if (messages.empty()) return known;
    auto c = pool_.Take();
    if (!c.ok()) return known;
    std::vector<std::string> keys;
    keys.reserve(messages.size());
    for (const Message& m : messages) keys.push_back(Key(consumer, m.id));
    std::vector<std::string_view> args{"MGET"};
    args.insert(args.end(), keys.begin(), keys.end());
    auto r = (*c)->Command(args);
    if (!r.ok() || (*r)->type != REDIS_REPLY_ARRAY || (*r)->elements != messages.size()) return known;
    for (size_t i = 0; i < messages.size(); ++i) {
      std::string_view stored = redis_internal::ReplyString((*r)->element[i]);
      known[i] = !stored.empty() && stored == FingerprintBytes(messages[i].payload);
    }
    return known;
  }

  // SET NX: the first fingerprint committed for an id stays; a later
  // delivery with another payload (a conflict) never replaces it.
  void Remember(std::string_view consumer, std::span<const Message> messages) override {
    if (messages.empty()) return;
    auto c = pool_.Take();
    if (!c.ok()) return;
    const std::string ttl = std::to_string(options_.ttl_ms);
    size_t queued = 0;
    for (const Message& m : messages) {
      const std::string key = Key(consumer, m.id);
      const std::string fp = FingerprintBytes(m.payload);
      std::string_view args[] = {"SET", key, fp, "NX", "PX", ttl};
      if (!(*c)->Append(args).ok()) break;
      ++queued;
    }
    // Read every reply, so the connection goes back clean; a failure leaves
    // replies unread and the pool drops the connection.
    for (size_t i = 0; i < queued; ++i) {
      if (!(*c)->Read("SET").ok()) break;
    }
  }

  Status Ping() override {
    IDEM_ASSIGN_OR_RETURN(Pool::Lease c, pool_.Take());
    return c->Command({"PING"}).status();
  }

 private:
  std::string Key(std::string_view consumer, std::string_view id) const {
    return options_.prefix + "seen:" + redis_internal::LengthPrefixed(consumer) + ":" + std::string(id);
  }

  const Options options_;
  Pool pool_;
};

}  // namespace

Result<std::unique_ptr<Prefilter>> Prefilter::Open(const Options& options) {
  IDEM_ASSIGN_OR_RETURN(redis_internal::Endpoint ep, redis_internal::ParseUrl(options.url));
  IDEM_RETURN_IF_ERROR(redis_internal::CheckConnectFields("Redis prefilter", options.pool_size,
                                                          options.connect_timeout_ms, options.command_timeout_ms,
                                                          options.client_name));
  if (options.ttl_ms < 1)
    return Status::InvalidArgument("Redis prefilter: ttl_ms must be at least 1, got " + std::to_string(options.ttl_ms));
  if (options.retry_after_ms < 0)
    return Status::InvalidArgument("Redis prefilter: retry_after_ms must be >= 0, got " +
                                   std::to_string(options.retry_after_ms));
  return std::unique_ptr<Prefilter>(new RedisPrefilter(options, std::move(ep)));
}

Result<Options> Prefilter::ParseUrl(std::string_view url) {
  using redis_internal::GetIntInto;
  using redis_internal::kMaxIntField;
  IDEM_ASSIGN_OR_RETURN(
      redis_internal::UrlWithOptions u,
      redis_internal::ParseUrlWithOptions(url, {"prefix", "ttl_ms", "client_name", "pool_size", "connect_timeout_ms",
                                                "command_timeout_ms", "retry_after_ms"}));
  Options o;
  o.url = u.base;
  o.prefix = u.parsed.Get("prefix", o.prefix);
  o.client_name = u.parsed.Get("client_name", o.client_name);
  IDEM_ASSIGN_OR_RETURN(o.ttl_ms, u.parsed.GetInt("ttl_ms", o.ttl_ms, 1, int64_t{1} << 50));
  IDEM_RETURN_IF_ERROR(GetIntInto(u.parsed, "pool_size", 1, 9999, o.pool_size));
  IDEM_RETURN_IF_ERROR(GetIntInto(u.parsed, "connect_timeout_ms", 1, kMaxIntField, o.connect_timeout_ms));
  IDEM_RETURN_IF_ERROR(GetIntInto(u.parsed, "command_timeout_ms", 1, kMaxIntField, o.command_timeout_ms));
  IDEM_RETURN_IF_ERROR(GetIntInto(u.parsed, "retry_after_ms", 0, kMaxIntField, o.retry_after_ms));
  return o;
}

}  // namespace idem::redis
