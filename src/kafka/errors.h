// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The one place where librdkafka error codes become idem Status codes.
#ifndef IDEM_SRC_KAFKA_ERRORS_H_
#define IDEM_SRC_KAFKA_ERRORS_H_

#include <librdkafka/rdkafka.h>

#include <string_view>

#include "idem/status.h"

namespace idem::kafka_internal {

// OK for RD_KAFKA_RESP_ERR_NO_ERROR; otherwise a Status whose message is
// "kafka: <context>: <error name>: <description>".
//   kLeaseLost        the group moved on (rebalance, fenced or unknown member,
//                     assignment lost): the partition is someone else's now
//   kUnavailable      transport, timeouts, no leader or coordinator yet: retry
//   kInvalidArgument  bad configuration or argument, unknown topic/partition
//   kBusy             a local queue is full
//   kAborted          the handle is being destroyed
//   kNotFound         no offset / nothing stored
//   kInternal         a fatal error or anything else
Status Translate(rd_kafka_resp_err_t err, std::string_view context);

}  // namespace idem::kafka_internal

#endif  // IDEM_SRC_KAFKA_ERRORS_H_
