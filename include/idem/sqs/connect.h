// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Where SQS is and who calls it: shared by idem::sqs::Source and
// idem::sqs::Publisher.
#ifndef IDEM_SQS_CONNECT_H_
#define IDEM_SQS_CONNECT_H_

#include <cstdint>
#include <string>

#include "idem/env.h"

namespace idem::sqs {

struct ConnectOptions {
  // The AWS region ("eu-west-1"). Empty: $AWS_REGION, $AWS_DEFAULT_REGION,
  // then the profile's region in the config file; none: kNotFound at Open.
  std::string region{};
  // Where the calls go: "http://127.0.0.1:PORT" (an emulator), or
  // "https://..." (a VPC endpoint). Empty: https://sqs.<region>.amazonaws.com,
  // or the origin of a queue given by its URL.
  std::string endpoint{};
  // The shared files' profile (else $AWS_PROFILE, else "default").
  std::string profile{};
  // Credentials given here win over every other source when access_key_id
  // is set. Empty: the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
  // AWS_SESSION_TOKEN), then the profile in ~/.aws/credentials and
  // ~/.aws/config. Never printed.
  std::string access_key_id{};
  std::string secret_access_key{};
  std::string session_token{};
  // https: the CA file (default: the system's).
  std::string ca_file{};
  // Connecting, in ms (> 0). Default: 2000.
  int64_t connect_timeout_ms = 2'000;
  // An answer not read within this (plus a long poll's wait), in ms (> 0),
  // is a lost answer. Default: 10000.
  int64_t read_timeout_ms = 10'000;
  // Tries per call, the first included, for throttling, 5xx and transport
  // failures, with exponential backoff (then the error). Default: 5.
  int max_attempts = 5;
  // Keep-alive connections kept for reuse. Default: 16.
  int pool_size = 16;
  // Clock, sleeps and jitter of the retries. Default: Env::Default().
  Env* env = nullptr;
};

}  // namespace idem::sqs

#endif  // IDEM_SQS_CONNECT_H_
