// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// librdkafka's mock cluster for the Kafka tests: 3 brokers in this process,
// one topic, and a consumer handle of the group that never joins it, to read
// the group's committed offsets.
#ifndef IDEM_TEST_KAFKA_MOCK_KAFKA_H_
#define IDEM_TEST_KAFKA_MOCK_KAFKA_H_

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <cstdint>
#include <memory>
#include <string>

namespace idem::testing {

class MockKafka {
 public:
  MockKafka(std::string topic, int partitions, std::string group)
      : topic_(std::move(topic)), partitions_(partitions), group_(std::move(group)) {
    char errstr[256];
    host_.reset(rd_kafka_new(RD_KAFKA_PRODUCER, rd_kafka_conf_new(), errstr, sizeof errstr));
    if (!host_) {
      error_ = errstr;
      return;
    }
    cluster_ = rd_kafka_mock_cluster_new(host_.get(), 3);
    if (cluster_ == nullptr) {
      error_ = "rd_kafka_mock_cluster_new failed";
      return;
    }
    brokers_ = rd_kafka_mock_cluster_bootstraps(cluster_);
    if (rd_kafka_mock_topic_create(cluster_, topic_.c_str(), partitions_, 1) != RD_KAFKA_RESP_ERR_NO_ERROR)
      error_ = "cannot create topic " + topic_;
  }
  ~MockKafka() {
    admin_.reset();
    if (cluster_ != nullptr) rd_kafka_mock_cluster_destroy(cluster_);
  }
  MockKafka(const MockKafka&) = delete;
  MockKafka& operator=(const MockKafka&) = delete;

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& brokers() const { return brokers_; }
  rd_kafka_mock_cluster_t* cluster() const { return cluster_; }

  // A consumer handle in the group that never joins it.
  rd_kafka_t* Admin() {
    if (!admin_) {
      char errstr[256];
      rd_kafka_conf_t* conf = rd_kafka_conf_new();
      rd_kafka_conf_set(conf, "bootstrap.servers", brokers_.c_str(), errstr, sizeof errstr);
      rd_kafka_conf_set(conf, "group.id", group_.c_str(), errstr, sizeof errstr);
      rd_kafka_conf_set(conf, "enable.auto.commit", "false", errstr, sizeof errstr);
      admin_.reset(rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof errstr));
    }
    return admin_.get();
  }

  // Whether the group's committed offset of every partition is the
  // partition's end: every record was acknowledged and committed.
  bool AllCommitted() {
    rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(partitions_);
    for (int p = 0; p < partitions_; ++p) rd_kafka_topic_partition_list_add(list, topic_.c_str(), p);
    bool ok = rd_kafka_committed(Admin(), list, 5'000) == RD_KAFKA_RESP_ERR_NO_ERROR;
    for (int p = 0; ok && p < partitions_; ++p) {
      int64_t lo = 0, hi = 0;
      ok =
          rd_kafka_query_watermark_offsets(Admin(), topic_.c_str(), p, &lo, &hi, 5'000) == RD_KAFKA_RESP_ERR_NO_ERROR &&
          (hi == 0 || list->elems[p].offset == hi);
    }
    rd_kafka_topic_partition_list_destroy(list);
    return ok;
  }

 private:
  struct Deleter {
    void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
  };
  std::string topic_;
  int partitions_;
  std::string group_;
  std::string error_;
  std::unique_ptr<rd_kafka_t, Deleter> host_;  // destroyed after the cluster (declared first)
  rd_kafka_mock_cluster_t* cluster_ = nullptr;
  std::string brokers_;
  std::unique_ptr<rd_kafka_t, Deleter> admin_;
};

}  // namespace idem::testing

#endif  // IDEM_TEST_KAFKA_MOCK_KAFKA_H_
