// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "kafka/conn.h"

#include <algorithm>
#include <chrono>

namespace idem::kafka_internal {

ListPtr NewList(int size) { return ListPtr(rd_kafka_topic_partition_list_new(std::max(1, size))); }

Status Set(rd_kafka_conf_t* conf, const std::string& name, const std::string& value) {
  char errstr[512];
  if (rd_kafka_conf_set(conf, name.c_str(), value.c_str(), errstr, sizeof errstr) != RD_KAFKA_CONF_OK)
    return Status::InvalidArgument("kafka: config " + name + "=" + value + ": " + errstr);
  return Status::OK();
}

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Status CheckBrokers(rd_kafka_t* rk, const std::string& brokers, int64_t timeout_ms) {
  const int timeout = static_cast<int>(std::clamp<int64_t>(timeout_ms, 1, INT32_MAX));
  const rd_kafka_metadata_t* md = nullptr;
  rd_kafka_resp_err_t err = rd_kafka_metadata(rk, 0, nullptr, &md, timeout);
  int answered = 0;
  if (md != nullptr) {
    answered = md->broker_cnt;
    rd_kafka_metadata_destroy(md);
  }
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR && answered > 0) return Status::OK();
  return Status::Unavailable("kafka: cannot connect to Kafka at " + brokers + ": no broker answered within " +
                             std::to_string(timeout) + " ms (" +
                             (err == RD_KAFKA_RESP_ERR_NO_ERROR ? std::string("no brokers in the metadata")
                                                                : std::string(rd_kafka_err2str(err))) +
                             ")");
}

}  // namespace idem::kafka_internal
