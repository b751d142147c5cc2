// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The SQS tests' emulator (fauxqs, scripts/test-sqs.sh): where the CTest
// fixture started it, the test credentials, and queues made for one test.
#ifndef IDEM_TEST_SQS_SQS_TEST_UTIL_H_
#define IDEM_TEST_SQS_SQS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "aws/client.h"
#include "idem/result.h"
#include "idem/sqs/connect.h"
#include "util/test_servers.h"

namespace idem::testing {

// The fixture's emulator: "sqs" (real clock) or "sqs-clock" (a clock the
// tests set, scripts/fauxqs-preload.cjs).
inline std::string SqsEndpoint(const std::string& server = "sqs") {
  return FixtureServerUrl(server, "http://127.0.0.1:1");
}

// The emulator checks no signature: any key signs.
inline sqs::ConnectOptions SqsConnect(const std::string& endpoint) {
  sqs::ConnectOptions c;
  c.region = "us-east-1";
  c.endpoint = endpoint;
  c.access_key_id = "AKIDIDEMTEST";
  c.secret_access_key = "idem-test-secret";
  return c;
}

// CreateQueue on the emulator (a name ending in ".fifo" makes a FIFO queue,
// without content-based deduplication).
inline Status CreateSqsQueue(const std::string& endpoint, const std::string& name, int visibility_s = 30) {
  auto client = aws_internal::JsonClient::Open(
      {.signing_name = "sqs", .target_prefix = "AmazonSQS", .content_type = "application/x-amz-json-1.0"},
      {.region = "us-east-1",
       .endpoint = endpoint,
       .credentials = {.access_key_id = "AKIDIDEMTEST", .secret_access_key = "idem-test-secret"}});
  if (!client.ok()) return client.status();
  nlohmann::json attrs = {{"VisibilityTimeout", std::to_string(visibility_s)}};
  if (name.ends_with(".fifo")) attrs["FifoQueue"] = "true";
  auto r = (*client)->Call("CreateQueue", {{"QueueName", name}, {"Attributes", attrs}});
  if (!r.ok()) return r.status();
  if (r->error) return aws_internal::ToStatus(*r->error, "CreateQueue " + name);
  return Status::OK();
}

// A queue name for this test (SQS: 1-80 of [A-Za-z0-9_-], ".fifo" included).
inline std::string SqsQueueName(const std::string& name, bool fifo = false) {
  std::string n = name.size() > 70 ? name.substr(name.size() - 70) : name;
  for (char& c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '-';
  return fifo ? n + ".fifo" : n;
}

}  // namespace idem::testing

#endif  // IDEM_TEST_SQS_SQS_TEST_UTIL_H_
