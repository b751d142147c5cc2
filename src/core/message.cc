// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/message.h"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <string>

namespace idem {

std::optional<std::string_view> Message::Header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return std::string_view(v);
  return std::nullopt;
}

Status ValidateId(std::string_view id) {
  if (id.empty()) return Status::InvalidArgument("message id is empty: the producer must assign a stable id");
  if (id.size() > kMaxIdBytes)
    return Status::InvalidArgument("message id is " + std::to_string(id.size()) + " bytes, longer than the " +
                                   std::to_string(kMaxIdBytes) + "-byte limit");
  return Status::OK();
}

namespace {
// OpenSSL 3 looks the algorithm up (under a lock) on every EVP_Digest call:
// fetch it once, and keep one context per thread.
const EVP_MD* Sha256() {
  static EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}
struct CtxDeleter {
  void operator()(EVP_MD_CTX* c) const noexcept { EVP_MD_CTX_free(c); }
};
}  // namespace

Fingerprint FingerprintOf(std::string_view payload) {
  Fingerprint fp{};
  unsigned int len = 0;
  thread_local std::unique_ptr<EVP_MD_CTX, CtxDeleter> ctx(EVP_MD_CTX_new());
  // SHA-256 of in-memory input cannot fail once the context exists.
  if (ctx && EVP_DigestInit_ex(ctx.get(), Sha256(), nullptr) == 1 &&
      EVP_DigestUpdate(ctx.get(), payload.data(), payload.size()) == 1 &&
      EVP_DigestFinal_ex(ctx.get(), fp.data(), &len) == 1)
    return fp;
  EVP_Digest(payload.data(), payload.size(), fp.data(), &len, EVP_sha256(), nullptr);
  return fp;
}

std::string ToHex(const Fingerprint& fp) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(fp.size() * 2);
  for (uint8_t b : fp) {
    s += kHex[b >> 4];
    s += kHex[b & 15];
  }
  return s;
}

Status ValidateStep(std::string_view step) {
  if (step.empty() || step.size() > kMaxStepBytes)
    return Status::InvalidArgument("step name must be 1.." + std::to_string(kMaxStepBytes) + " bytes, got " +
                                   std::to_string(step.size()));
  for (unsigned char c : step)
    if (c < 0x21 || c > 0x7E)
      return Status::InvalidArgument("step name '" + Printable(step) +
                                     "' holds a byte that is not visible ASCII (0x21-0x7E)");
  return Status::OK();
}

std::string DownstreamKey(std::string_view id, std::string_view step) {
  if (!ValidateStep(step).ok()) return "!invalid-step";
  const bool carriable = std::all_of(id.begin(), id.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c >= 0x20 && c <= 0x7E;
  });
  std::string key;
  if (carriable && id.size() + 1 + step.size() <= kMaxKeyBytes && !id.starts_with(kHashedKeyPrefix)) {
    key.reserve(id.size() + 1 + step.size());
    key.append(id);
  } else {
    key.append(kHashedKeyPrefix);
    key.append(ToHex(FingerprintOf(id)));
  }
  key += ':';
  key.append(step);
  return key;
}

std::string DownstreamKey(const Message& message, std::string_view step) { return DownstreamKey(message.id, step); }

std::string Printable(std::string_view bytes, std::size_t max) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < bytes.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c <= 0x7E && c != '\\') {
      s += static_cast<char>(c);
    } else {
      s += "\\x";
      s += kHex[c >> 4];
      s += kHex[c & 15];
    }
  }
  if (bytes.size() > max) s += "...";
  return s;
}

}  // namespace idem
