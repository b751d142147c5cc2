// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// What the Pub/Sub tests share: the fixture's emulator and unique names.
#ifndef IDEM_TEST_PUBSUB_PUBSUB_TEST_UTIL_H_
#define IDEM_TEST_PUBSUB_PUBSUB_TEST_UTIL_H_

#include <string>

#include "idem/pubsub/publisher.h"
#include "idem/pubsub/source.h"
#include "util/test_servers.h"

namespace idem::testing {

inline constexpr const char* kPubsubProject = "idem-test";

// The emulator the fixture "pubsub" started (http://127.0.0.1:PORT).
inline std::string PubsubEndpoint() { return FixtureServerUrl("pubsub", "http://127.0.0.1:1"); }

inline pubsub::Connection PubsubConnection() { return {.project = kPubsubProject, .endpoint = PubsubEndpoint()}; }

// A name no other test or run uses, valid as a topic or subscription id.
inline std::string PubsubName(const std::string& prefix) { return UniqueServerName(prefix); }

}  // namespace idem::testing

#endif  // IDEM_TEST_PUBSUB_PUBSUB_TEST_UTIL_H_
