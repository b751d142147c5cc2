// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Opening by URL: one call for any store, source or publisher this
// installation was built with, by the grammar of idem/url.h. Each adapter
// also has its own `Options`, `Open` and `ParseUrl` (doc/adapters.md); these
// functions pick the adapter from the URL's scheme and call them.
//
//   stores:     sqlite:PATH[?...]  postgres://...  redis://HOST[:PORT][/DB]
//   sources and publishers:
//               embedded:PATH?queue=Q
//               redis://HOST[:PORT][/DB]?stream=S&group=G
//               amqp://USER:PASS@HOST[:PORT]/VHOST?queue=Q
//               kafka://HOST:PORT[,...]?topic=T&group=G
//               pubsub://PROJECT/SUBSCRIPTION[?topic=T][&endpoint=URL]
//
// Link idem::open: find_package(idem COMPONENTS open) brings SQLite and the
// embedded queue; name the other adapters whose URLs a program opens
// (find_package(idem COMPONENTS open postgres kafka)), and idem::open links
// them. A scheme whose component was not built, or is not linked into this
// program, gives kInvalidArgument naming the component, as does an unknown
// scheme. StoreSchemes() and SourceSchemes() list what this program opens.
//
// Thread safety: the functions may be called from any thread.
#ifndef IDEM_OPEN_H_
#define IDEM_OPEN_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/claim_store.h"
#include "idem/env.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/store.h"

namespace idem {

// What a source URL does not carry, shared by every source: the options of
// OpenSource (doc/adapters.md: every set of options is an Options struct).
struct SourceOptions {
  // How long a delivery stays this consumer's before the source may hand it
  // to another, where the source has such a lease (embedded, Redis,
  // RabbitMQ's optional one). Default: 30 s. A URL's lease_ms= wins.
  int64_t lease_ms = 30'000;
  // This process's name in a consumer group: the Redis consumer name, the
  // Kafka client.id. A URL's consumer= (Redis) or client_id= (Kafka) wins.
  // Empty: the adapter's own default, a new Redis consumer name per start
  // ("idem-<hostname>-<pid>-<random>", StreamSource::consumer() reports it;
  // never one name shared by every process) and Kafka's client_id "idem".
  // A stable name per process slot lets a restart take back its pending
  // entries (doc/sources.md). Default: empty.
  std::string consumer{};
  // The clock the source reads its leases, waits and delivery times from,
  // where it has one (embedded, Redis Streams); it must outlive the source.
  // Default: null (Env::Default()).
  Env* env = nullptr;
};

// What a store URL may not carry, shared by every store: the options of
// OpenStore and OpenClaimStore.
struct StoreOptions {
  // Create the database (the file, on SQLite) and idem's tables when
  // missing. false: a missing database or schema is an error (inspecting
  // must not create one). A URL's create_if_missing=false
  // (idem_create_if_missing=false on PostgreSQL) also says false.
  // Default: true.
  bool create_if_missing = true;
  // Connections a PostgreSQL store keeps for reuse; 0: the URL's
  // idem_pool_size, or the adapter's default. Default: 0.
  int pool_size = 0;
  // The clock of the store's records and waits (idem/env.h); it must
  // outlive the store. Default: null (Env::Default()).
  Env* env = nullptr;
};

// The names of 0.2, kept for one version (doc/migration.md).
using SourceSettings [[deprecated("renamed idem::SourceOptions")]] = SourceOptions;
using StoreSettings [[deprecated("renamed idem::StoreOptions")]] = StoreOptions;

// A Store: sqlite:PATH (or a bare PATH), postgres:// or postgresql://.
// redis:// is kInvalidArgument (it keeps claims only: OpenClaimStore).
Result<std::unique_ptr<Store>> OpenStore(std::string_view url);
Result<std::unique_ptr<Store>> OpenStore(std::string_view url, const StoreOptions& settings);
// A ClaimStore: redis://, or a SQL store's URL, whose ClaimStore then owns
// the Store it lives in.
Result<std::unique_ptr<ClaimStore>> OpenClaimStore(std::string_view url);
Result<std::unique_ptr<ClaimStore>> OpenClaimStore(std::string_view url, const StoreOptions& settings);
// A Source (embedded:, redis://, amqp://, kafka://, pubsub://).
Result<std::unique_ptr<Source>> OpenSource(std::string_view url, const SourceOptions& settings = {});
// A Publisher onto the same place a Source of that URL reads.
Result<std::unique_ptr<Publisher>> OpenPublisher(std::string_view url);

// The schemes this installation can open, e.g. {"sqlite", "embedded"}.
// StoreSchemes lists those of OpenClaimStore too ("redis" keeps claims only).
std::vector<std::string> StoreSchemes();
std::vector<std::string> SourceSchemes();

}  // namespace idem

#endif  // IDEM_OPEN_H_
