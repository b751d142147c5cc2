// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Message: one fact delivered at least once, identified by a stable id that
// the producer assigned (the same on every delivery and every producer retry).
//
// Thread safety: a plain value type.
#ifndef IDEM_MESSAGE_H_
#define IDEM_MESSAGE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/status.h"

namespace idem {

// Longest message id, in bytes. Ids are stored byte-exact (any bytes, not
// only UTF-8), so "m-7f3" and "M-7F3" are different ids.
inline constexpr std::size_t kMaxIdBytes = 255;

struct Message {
  // Required: 1 to kMaxIdBytes bytes, assigned by the producer with the
  // business fact (order id, outbox event id), never per delivery.
  std::string id{};
  // Optional: when the producer created the fact, in milliseconds since the
  // Unix epoch. Carried, never used to decide duplicates.
  std::optional<int64_t> producer_time_ms{};
  // The body, any bytes. Its SHA-256 is the fingerprint that tells a duplicate
  // (same id, same payload) from a conflict (same id, other payload).
  std::string payload{};
  // Free-form headers, in delivery order.
  std::vector<std::pair<std::string, std::string>> headers{};
  // 1 on the first delivery, as counted by the source. 0 when unknown.
  int attempt = 0;

  // The first header with this name, if any.
  std::optional<std::string_view> Header(std::string_view name) const;
};

// OK, or InvalidArgument naming what is wrong with the id (empty, too long).
Status ValidateId(std::string_view id);

// SHA-256 of the payload (32 bytes).
using Fingerprint = std::array<uint8_t, 32>;
Fingerprint FingerprintOf(std::string_view payload);
// Lower-case hex, 64 characters.
std::string ToHex(const Fingerprint& fp);

// The idempotency key for a call that no local transaction covers (a payment
// provider, another service). The same message and step give the same key on
// every delivery, so the receiver can recognise the repeat. `step` names the
// call ("charge", "email") so one message can make several distinct calls;
// it must be 1..kMaxStepBytes bytes of visible ASCII (0x21-0x7E) and is
// checked by ValidateStep.
//
// Every valid message id gets a key of at most kMaxKeyBytes bytes of
// 0x20-0x7E, which any header (and an RFC 8941 sf-string) can carry:
//  - "<id>:<step>" when that fits in kMaxKeyBytes, every byte of the id is
//    0x20-0x7E, and the id does not begin with "sha256~";
//  - otherwise "sha256~<64 lower-case hex digits of SHA-256(id)>:<step>".
// No plain key begins with "sha256~", so the two forms never collide, and
// the hashed form is as collision-resistant as SHA-256. An invalid step
// gives the key of step "invalid-step" prefixed with "!" (never a valid
// key's shape); callers that take a step (CallOnce) refuse it first.
inline constexpr std::size_t kMaxKeyBytes = 255;
inline constexpr std::size_t kMaxStepBytes = 64;
inline constexpr std::string_view kHashedKeyPrefix = "sha256~";
std::string DownstreamKey(const Message& message, std::string_view step);
std::string DownstreamKey(std::string_view message_id, std::string_view step);
// OK, or InvalidArgument naming what is wrong with the step name.
Status ValidateStep(std::string_view step);
// `bytes` for people: printable ASCII as is, other bytes as \xNN, at most
// `max` bytes of input shown ("..." after). For error messages and logs.
std::string Printable(std::string_view bytes, std::size_t max = 80);

}  // namespace idem

#endif  // IDEM_MESSAGE_H_
