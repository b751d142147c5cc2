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
//
// Link idem::open (find_package(idem COMPONENTS open)): it brings every
// component of this installation. A scheme whose component was not built
// gives kInvalidArgument naming the component, as does an unknown scheme.
//
// Thread safety: the functions may be called from any thread.
#ifndef IDEM_OPEN_H_
#define IDEM_OPEN_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/claims.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/store.h"

namespace idem {

// Settings a URL does not carry, shared by every source.
struct SourceSettings {
  // How long a delivery stays this consumer's before the source may hand it
  // to another, where the source has such a lease (embedded, Redis,
  // RabbitMQ's optional one). Default: 30 s. A URL's lease_ms= wins.
  int64_t lease_ms = 30'000;
  // This process's name in a consumer group: the Redis consumer name, the
  // Kafka client.id. A URL's consumer= (Redis) or client_id= (Kafka) wins.
  // Give each process its own (Redis keeps pending entries per name).
  // Default: "idem".
  std::string consumer = "idem";
};

// A Store (sqlite:, postgres://).
Result<std::unique_ptr<Store>> OpenStore(std::string_view url);
// A ClaimStore (sqlite:, postgres://, redis://).
Result<std::unique_ptr<ClaimStore>> OpenClaimStore(std::string_view url);
// A Source (embedded:, redis://, amqp://, kafka://).
Result<std::unique_ptr<Source>> OpenSource(std::string_view url, const SourceSettings& settings = {});
// A Publisher onto the same place a Source of that URL reads.
Result<std::unique_ptr<Publisher>> OpenPublisher(std::string_view url);

// The schemes this installation can open, e.g. {"sqlite", "embedded"}.
std::vector<std::string> StoreSchemes();
std::vector<std::string> SourceSchemes();

}  // namespace idem

#endif  // IDEM_OPEN_H_
