// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the librdkafka handles the kafka Source and Publisher share
// (RAII owners, configuration, the broker check) and the small helpers around
// them. Never included from a public header.
#ifndef IDEM_SRC_KAFKA_CONN_H_
#define IDEM_SRC_KAFKA_CONN_H_

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <memory>
#include <string>

#include "idem/status.h"

namespace idem::kafka_internal {

struct RkDeleter {
  void operator()(rd_kafka_t* rk) const noexcept { rd_kafka_destroy(rk); }
};
struct ConfDeleter {
  void operator()(rd_kafka_conf_t* c) const noexcept { rd_kafka_conf_destroy(c); }
};
struct ListDeleter {
  void operator()(rd_kafka_topic_partition_list_t* l) const noexcept { rd_kafka_topic_partition_list_destroy(l); }
};
struct MessageDeleter {
  void operator()(rd_kafka_message_t* m) const noexcept { rd_kafka_message_destroy(m); }
};
struct ErrorDeleter {
  void operator()(rd_kafka_error_t* e) const noexcept { rd_kafka_error_destroy(e); }
};
struct HeadersDeleter {
  void operator()(rd_kafka_headers_t* h) const noexcept { rd_kafka_headers_destroy(h); }
};
using RkPtr = std::unique_ptr<rd_kafka_t, RkDeleter>;
using ConfPtr = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;
using ListPtr = std::unique_ptr<rd_kafka_topic_partition_list_t, ListDeleter>;
using MessagePtr = std::unique_ptr<rd_kafka_message_t, MessageDeleter>;
using ErrorPtr = std::unique_ptr<rd_kafka_error_t, ErrorDeleter>;
using HeadersPtr = std::unique_ptr<rd_kafka_headers_t, HeadersDeleter>;

// A partition list with room for `size` (at least 1) entries.
ListPtr NewList(int size);

// Sets one librdkafka property: kInvalidArgument naming it and the value.
Status Set(rd_kafka_conf_t* conf, const std::string& name, const std::string& value);

// The steady clock, in ms (for poll intervals, never for leases).
int64_t SteadyMs();

// Asks the cluster behind `rk` for its metadata (the brokers; no topic) and
// waits up to `timeout_ms` for an answer: kUnavailable naming `brokers` when
// none came (librdkafka itself would only log and retry forever).
Status CheckBrokers(rd_kafka_t* rk, const std::string& brokers, int64_t timeout_ms);

}  // namespace idem::kafka_internal

#endif  // IDEM_SRC_KAFKA_CONN_H_
