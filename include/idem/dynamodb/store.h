// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The DynamoDB store: markers, failure counts, dead letters and claims in
// one DynamoDB table of idem's (key pk S, sk B), over DynamoDB's JSON
// protocol (signed with AWS Signature Version 4). A handler writes items
// (idem/dynamodb/items.h, ItemsOf(tx)); at commit they go in one
// TransactWriteItems with the message's marker, a Put conditioned on
// attribute_not_exists: a duplicate cancels the transaction with
// ConditionalCheckFailed on the marker and nothing of it is written. A
// commit whose answer is lost is sent again with the same
// ClientRequestToken, which DynamoDB applies at most once; if no answer
// comes at all, the commit is kInDoubt and the marker settles it.
//
// Exec/Query (SQL) are refused with kInvalidArgument; the store has no
// outbox (doc/stores.md says why).
//
// Thread safety: the Store is safe from many threads; a transaction
// belongs to one thread at a time.
#ifndef IDEM_DYNAMODB_STORE_H_
#define IDEM_DYNAMODB_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/dynamodb/items.h"
#include "idem/env.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem::dynamodb {

// Opens DynamoDB stores. What Open returns is an idem::Store (idem/store.h);
// its claim_store() keeps claims (two-phase mode) in the same table.
class Store {
 public:
  struct Options {
    // idem's table (3-255 of a-z A-Z 0-9 _ - .). Required. URL: the host
    // part, dynamodb://TABLE.
    std::string table{};
    // The region; "" looks where the AWS SDKs look ($AWS_REGION,
    // $AWS_DEFAULT_REGION, the profile's). URL: ?region=.
    std::string region{};
    // "http://127.0.0.1:8000" (DynamoDB Local) or a VPC endpoint; ""
    // for https://dynamodb.REGION.amazonaws.com. URL: ?endpoint=.
    std::string endpoint{};
    // The shared files' profile for credentials and region ("": $AWS_PROFILE,
    // else "default"). Credentials come as the SDKs find them; never in the
    // URL. URL: ?profile=.
    std::string profile{};
    // Create the table (on-demand billing, TTL on `expires_at`) when it is
    // missing. When false, a missing table is kNotFound naming it.
    // URL: ?create_if_missing=true|false. Default: true.
    bool create_if_missing = true;
    // Markers carry `expires_at` (seconds since the epoch) this long after
    // they were written, and DynamoDB's TTL deletes them some time after
    // (within days; until then they still count). 0: no expiry (Purge
    // deletes). URL: ?marker_ttl_s=N. Default: 0.
    int64_t marker_ttl_s = 0;
    // Tries per call for throttling (ProvisionedThroughputExceeded,
    // ThrottlingException), 5xx and lost answers, the first included; then
    // kBusy (throttled) or kInDoubt / kUnavailable. URL: ?max_attempts=N.
    // Default: 5.
    int max_attempts = 5;
    // Keep-alive connections. URL: ?pool_size=N. Default: 16.
    int pool_size = 16;
    // The clock of the records (and of claims: DynamoDB has no server clock
    // to read, so every client's must be right). Default: Env::Default().
    Env* env = nullptr;
    // Claims' clock when not `env` (tests pass a FakeEnv).
    Env* claim_clock = nullptr;
    // Credentials given here win over the SDKs' sources (tests).
    std::string access_key_id{};
    std::string secret_access_key{};
  };
  // Checks the options, finds credentials and region, and checks (or
  // creates) the table. Errors: kInvalidArgument (a bad option, naming it;
  // refused credentials), kNotFound (no credentials, or the table is
  // missing in the region named and create_if_missing is off: a wrong
  // region shows so; with create_if_missing on it makes a new table there),
  // kSchemaMismatch (a table of that name whose key is not idem's),
  // kUnavailable (the endpoint does not answer), kBusy (throttled past
  // max_attempts).
  static Result<std::unique_ptr<idem::Store>> Open(const Options& options);
  // Reads "dynamodb://TABLE?region=..&endpoint=..&profile=..&create_if_missing=..
  // &marker_ttl_s=..&max_attempts=..&pool_size=..". An unknown key, or one
  // given twice: kInvalidArgument naming it.
  static Result<Options> ParseUrl(std::string_view url);
  Store() = delete;
};

}  // namespace idem::dynamodb

#endif  // IDEM_DYNAMODB_STORE_H_
