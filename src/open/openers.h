// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: how idem::open reaches the adapters that have their own
// third-party dependencies (PostgreSQL, Redis, RabbitMQ, Kafka) without
// making a program that links idem::open link them all.
//
// Each such adapter's opener is a file of its own in libidem_open
// (open_<component>.cc) with an anchor symbol, idem_open_link_<component>.
// The dispatchers (open_store.cc, open_source.cc) refer to the openers
// weakly: an opener is in a program only when the link asks for its anchor
// (-Wl,-u,idem_open_link_<component>), which idem::open carries for every
// adapter in the build tree, and idemConfig.cmake adds for each adapter a
// program asks for with find_package(idem COMPONENTS open <component>). A
// null opener: that adapter is not linked into this program.
#ifndef IDEM_SRC_OPEN_OPENERS_H_
#define IDEM_SRC_OPEN_OPENERS_H_

#include <memory>
#include <string_view>

#include "idem/open.h"

// The anchors (each defined beside its opener).
extern "C" {
void idem_open_link_postgres();
void idem_open_link_redis();
void idem_open_link_redis_streams();
void idem_open_link_amqp();
void idem_open_link_kafka();
void idem_open_link_pubsub();
void idem_open_link_sqs();
void idem_open_link_dynamodb();
}

namespace idem::open_internal {

[[gnu::weak]] Result<std::unique_ptr<Store>> OpenPostgresStore(std::string_view url, const StoreOptions& settings);
[[gnu::weak]] Result<std::unique_ptr<ClaimStore>> OpenRedisClaimStore(std::string_view url,
                                                                      const StoreOptions& settings);
[[gnu::weak]] Result<std::unique_ptr<Source>> OpenRedisStreamsSource(std::string_view url,
                                                                     const SourceOptions& settings);
[[gnu::weak]] Result<std::unique_ptr<Publisher>> OpenRedisStreamsPublisher(std::string_view url);
[[gnu::weak]] Result<std::unique_ptr<Source>> OpenAmqpSource(std::string_view url, const SourceOptions& settings);
[[gnu::weak]] Result<std::unique_ptr<Publisher>> OpenAmqpPublisher(std::string_view url);
[[gnu::weak]] Result<std::unique_ptr<Source>> OpenKafkaSource(std::string_view url, const SourceOptions& settings);
[[gnu::weak]] Result<std::unique_ptr<Publisher>> OpenKafkaPublisher(std::string_view url);
[[gnu::weak]] Result<std::unique_ptr<Source>> OpenPubsubSource(std::string_view url, const SourceOptions& settings);
[[gnu::weak]] Result<std::unique_ptr<Publisher>> OpenPubsubPublisher(std::string_view url);
[[gnu::weak]] Result<std::unique_ptr<Source>> OpenSqsSource(std::string_view url, const SourceOptions& settings);
[[gnu::weak]] Result<std::unique_ptr<Publisher>> OpenSqsPublisher(std::string_view url);
[[gnu::weak]] Result<std::unique_ptr<Store>> OpenDynamodbStore(std::string_view url, const StoreOptions& settings);

// Whether the URL's query sets `key` (then it wins over SourceOptions).
bool UrlSets(std::string_view url, std::string_view key);

// kInvalidArgument: `component` was built into idem::open but this program
// does not link it.
Status NotLinked(std::string_view component, std::string_view url);

}  // namespace idem::open_internal

#endif  // IDEM_SRC_OPEN_OPENERS_H_
