// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "httplib/client_address.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>

namespace idem::httplib::internal {
namespace {

constexpr std::string_view kV1Prefix = "PROXY ";
constexpr size_t kV1Max = 107;  // the longest v1 line, CRLF included
constexpr char kV2Signature[12] = {'\r', '\n', '\r', '\n', '\0', '\r', '\n', 'Q', 'U', 'I', 'T', '\n'};
constexpr std::string_view kV2Sig(kV2Signature, sizeof kV2Signature);
constexpr size_t kV2Head = 16;  // the signature, version and command, family, length

// Whether `a` (the shorter) is where `b` starts.
bool PrefixOf(std::string_view a, std::string_view b) { return a.size() <= b.size() && b.substr(0, a.size()) == a; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A decimal port 0..65535 without leading zeros.
bool ParsePort(std::string_view s, int& port) {
  if (s.empty() || s.size() > 5 || (s.size() > 1 && s[0] == '0')) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), port);
  return ec == std::errc() && end == s.data() + s.size() && port <= 65535;
}

bool IsV4(const IpAddress& a) {
  static constexpr std::array<uint8_t, 12> kMapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::equal(kMapped.begin(), kMapped.end(), a.bytes.begin());
}

IpAddress FromV4(const uint8_t* four) {
  IpAddress a;
  a.bytes[10] = a.bytes[11] = 0xff;
  std::memcpy(a.bytes.data() + 12, four, 4);
  return a;
}

// One X-Forwarded-For entry: an address, optionally with a port
// ("a.b.c.d:p", "[v6]:p").
std::optional<IpAddress> ParseForwardedEntry(std::string_view e) {
  if (!e.empty() && e.front() == '[') {
    const size_t close = e.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    const std::string_view rest = e.substr(close + 1);
    int port = 0;
    if (!rest.empty() && (rest[0] != ':' || !ParsePort(rest.substr(1), port))) return std::nullopt;
    const std::string_view inner = e.substr(1, close - 1);
    if (inner.find(':') == std::string_view::npos) return std::nullopt;  // "[1.2.3.4]"
    return ParseIp(inner);
  }
  if (const size_t colon = e.find(':'); colon != std::string_view::npos && e.find(':', colon + 1) == e.npos) {
    int port = 0;  // "a.b.c.d:port" (one colon: no IPv6 address has only one)
    if (!ParsePort(e.substr(colon + 1), port)) return std::nullopt;
    return ParseIp(e.substr(0, colon));
  }
  return ParseIp(e);
}

ProxyParse Malformed(std::string& why, std::string text) {
  why = std::move(text);
  return ProxyParse::kMalformed;
}

ProxyParse ParseV1(std::string_view bytes, ProxyHeader& out, std::string& why) {
  const size_t eol = bytes.substr(0, kV1Max).find("\r\n");
  if (eol == std::string_view::npos) {
    if (bytes.size() >= kV1Max) return Malformed(why, "a PROXY v1 line longer than 107 bytes");
    if (bytes.find_first_of("\r\n") != std::string_view::npos && bytes.back() != '\r')
      return Malformed(why, "a PROXY v1 line not ended by CRLF");
    return ProxyParse::kNeedMore;
  }
  std::vector<std::string_view> f;
  for (std::string_view line = bytes.substr(0, eol);;) {
    const size_t sp = line.find(' ');
    f.push_back(line.substr(0, sp));
    if (sp == std::string_view::npos) break;
    line.remove_prefix(sp + 1);
  }
  out = ProxyHeader{.length = eol + 2};
  if (f.size() >= 2 && f[1] == "UNKNOWN") return ProxyParse::kDone;  // the rest is to be ignored
  if (f.size() != 6 || (f[1] != "TCP4" && f[1] != "TCP6"))
    return Malformed(why, "a PROXY v1 line that is not 'PROXY TCP4|TCP6 SRC DST SPORT DPORT' or 'PROXY UNKNOWN'");
  const bool v6 = f[1] == "TCP6";
  const auto src = ParseIp(f[2]), dst = ParseIp(f[3]);
  int dport = 0;
  if (!src || !dst || IsV4(*src) == v6 || IsV4(*dst) == v6)
    return Malformed(why, std::string("a PROXY v1 line whose addresses are not ") + (v6 ? "IPv6" : "IPv4"));
  if (!ParsePort(f[4], out.source_port) || !ParsePort(f[5], dport))
    return Malformed(why, "a PROXY v1 line whose ports are not 0..65535");
  out.source = src;
  return ProxyParse::kDone;
}

ProxyParse ParseV2(std::string_view bytes, ProxyHeader& out, std::string& why) {
  if (bytes.size() < kV2Head) return ProxyParse::kNeedMore;
  const auto b = [&](size_t i) { return static_cast<uint8_t>(bytes[i]); };
  if ((b(12) >> 4) != 2) return Malformed(why, "a PROXY v2 header of version " + std::to_string(b(12) >> 4));
  const int command = b(12) & 0xf, family = b(13) >> 4, protocol = b(13) & 0xf;
  if (command > 1) return Malformed(why, "a PROXY v2 header with command " + std::to_string(command));
  if (family > 3 || protocol > 2) return Malformed(why, "a PROXY v2 header with an unknown family or protocol");
  const size_t len = (size_t{b(14)} << 8) | b(15);
  if (bytes.size() < kV2Head + len) return ProxyParse::kNeedMore;
  out = ProxyHeader{.length = kV2Head + len};
  if (command == 0 || family == 0 || family == 3) return ProxyParse::kDone;  // LOCAL, UNSPEC, UNIX: the proxy's own
  const size_t need = family == 1 ? 12 : 36, size = family == 1 ? 4 : 16;
  if (len < need) return Malformed(why, "a PROXY v2 header whose length is too short for its addresses");
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data()) + kV2Head;
  IpAddress src;
  if (family == 1) {
    src = FromV4(p);
  } else {
    std::memcpy(src.bytes.data(), p, 16);
  }
  out.source = src;
  out.source_port = (p[2 * size] << 8) | p[2 * size + 1];
  return ProxyParse::kDone;
}

}  // namespace

std::optional<IpAddress> ParseIp(std::string_view text) {
  if (text.empty() || text.size() > 45) return std::nullopt;
  const std::string s(text);
  IpAddress a;
  if (s.find(':') != std::string::npos) {
    if (::inet_pton(AF_INET6, s.c_str(), a.bytes.data()) != 1) return std::nullopt;
    return a;
  }
  uint8_t four[4];
  if (::inet_pton(AF_INET, s.c_str(), four) != 1) return std::nullopt;
  return FromV4(four);
}

std::string CanonicalIp(const IpAddress& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (IsV4(a)) {
    ::inet_ntop(AF_INET, a.bytes.data() + 12, buf, sizeof buf);
  } else {
    ::inet_ntop(AF_INET6, a.bytes.data(), buf, sizeof buf);
  }
  return buf;
}

std::string CanonicalIp(std::string_view text) {
  const auto a = ParseIp(text);
  return a ? CanonicalIp(*a) : std::string(text);
}

std::optional<TrustedProxies> TrustedProxies::Parse(const std::vector<std::string>& entries, std::string& bad) {
  TrustedProxies out;
  for (const std::string& entry : entries) {
    const std::string_view e = Trim(entry);
    const size_t slash = e.find('/');
    const auto ip = ParseIp(e.substr(0, slash));
    Block block{.net = ip.value_or(IpAddress{}), .bits = 128};
    bool ok = ip.has_value();
    if (ok && slash != std::string_view::npos) {
      const std::string_view digits = e.substr(slash + 1);
      int bits = -1;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), bits);
      const int max = IsV4(*ip) ? 32 : 128;
      ok = !digits.empty() && ec == std::errc() && end == digits.data() + digits.size() && bits >= 0 && bits <= max;
      block.bits = bits + (IsV4(*ip) ? 96 : 0);
    }
    if (!ok) {
      bad = entry;
      return std::nullopt;
    }
    // The host bits cleared: "10.1.2.3/8" is 10.0.0.0/8.
    for (int i = block.bits; i < 128; ++i) block.net.bytes[i / 8] &= static_cast<uint8_t>(~(0x80u >> (i % 8)));
    out.blocks_.push_back(block);
  }
  return out;
}

bool TrustedProxies::Contains(const IpAddress& a) const {
  return std::any_of(blocks_.begin(), blocks_.end(), [&](const Block& b) {
    const int whole = b.bits / 8, rest = b.bits % 8;
    if (std::memcmp(a.bytes.data(), b.net.bytes.data(), static_cast<size_t>(whole)) != 0) return false;
    if (rest == 0) return true;
    const auto mask = static_cast<uint8_t>(0xff00u >> rest);
    return (a.bytes[static_cast<size_t>(whole)] & mask) == b.net.bytes[static_cast<size_t>(whole)];
  });
}

bool TrustedProxies::Contains(std::string_view text) const {
  if (blocks_.empty()) return false;
  const auto a = ParseIp(text);
  return a && Contains(*a);
}

ProxyParse ParseProxyHeader(std::string_view bytes, ProxyHeader& out, std::string& why) {
  if (bytes.empty()) return ProxyParse::kNeedMore;
  const std::string_view start = bytes.substr(0, std::min(bytes.size(), kV2Sig.size()));
  if (PrefixOf(bytes.substr(0, kV1Prefix.size()), kV1Prefix))
    return bytes.size() < kV1Prefix.size() ? ProxyParse::kNeedMore : ParseV1(bytes, out, why);
  if (PrefixOf(start, kV2Sig)) return start.size() < kV2Sig.size() ? ProxyParse::kNeedMore : ParseV2(bytes, out, why);
  return Malformed(why, "no PROXY header (the connection starts with " + QuotedForLog(bytes.substr(0, 16)) + ")");
}

bool LooksLikeProxyHeader(std::string_view bytes) {
  if (PrefixOf(kV1Prefix, bytes)) return true;
  return bytes.size() >= 5 && PrefixOf(bytes.substr(0, kV2Sig.size()), kV2Sig);
}

std::string ForwardedForIn(std::string_view head) {
  static constexpr std::string_view kName = "x-forwarded-for:";
  std::string out;
  for (size_t at = head.find("\r\n"); at != std::string_view::npos;) {
    const size_t from = at + 2, next = head.find("\r\n", from);
    const std::string_view line = head.substr(from, next == std::string_view::npos ? head.npos : next - from);
    if (line.size() >= kName.size() && std::equal(kName.begin(), kName.end(), line.begin(), [](char want, char c) {
          return want == (c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
        })) {
      if (!out.empty()) out += ',';
      out += line.substr(kName.size());
    }
    at = next;
  }
  return out;
}

ForwardedFor ClientInForwardedFor(std::string_view list, const TrustedProxies& trusted, IpAddress& client,
                                  std::string& bad) {
  if (Trim(list).empty()) return ForwardedFor::kAbsent;
  for (size_t end = list.size();;) {
    const size_t comma = list.rfind(',', end == 0 ? 0 : end - 1);
    const size_t from = comma == std::string_view::npos || comma >= end ? 0 : comma + 1;
    const std::string_view entry = Trim(list.substr(from, end - from));
    const auto a = ParseForwardedEntry(entry);
    if (!a) {
      bad = entry.substr(0, 64);
      return ForwardedFor::kMalformed;
    }
    client = *a;
    if (!trusted.Contains(*a) || from == 0) return ForwardedFor::kClient;
    end = from - 1;
  }
}

std::string QuotedForLog(std::string_view text) {
  std::string out = "\"";
  for (const char c : text.substr(0, 64)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') {
      out += c;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    }
  }
  if (text.size() > 64) out += "...";
  return out + "\"";
}

}  // namespace idem::httplib::internal
