// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: who the client of a connection or request is when it comes
// through a trusted proxy (idem::httplib::Server::Options::trusted_proxies):
// IP addresses and CIDR blocks, the PROXY protocol header (v1 text, v2
// binary; haproxy.org/download/2.9/doc/proxy-protocol.txt) a proxy sends at
// the start of a connection, and X-Forwarded-For. Pure functions: no I/O.
#ifndef IDEM_SRC_HTTPLIB_CLIENT_ADDRESS_H_
#define IDEM_SRC_HTTPLIB_CLIENT_ADDRESS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::httplib::internal {

// An IPv4 or IPv6 address; IPv4 held as IPv6's v4-mapped form
// (::ffff:a.b.c.d), so "10.0.0.1" and "::ffff:10.0.0.1" are one address.
struct IpAddress {
  std::array<uint8_t, 16> bytes{};
  bool operator==(const IpAddress&) const = default;
};

// A numeric IPv4 ("10.0.0.1") or IPv6 ("fd00::1", no zone) address;
// nullopt for anything else (a name, a port, leading zeros, spaces).
std::optional<IpAddress> ParseIp(std::string_view text);
// One text for one address: dotted IPv4 for v4 (and v4-mapped), else
// RFC 5952 IPv6. The per-client bound counts by it.
std::string CanonicalIp(const IpAddress& a);
// `text` in canonical form when it is an address, else `text` as it is.
std::string CanonicalIp(std::string_view text);

// Addresses and CIDR blocks ("10.0.0.0/8", "fd00::/8", "192.0.2.7").
class TrustedProxies {
 public:
  // nullopt (with `bad`, the entry) when an entry is neither.
  static std::optional<TrustedProxies> Parse(const std::vector<std::string>& entries, std::string& bad);
  bool empty() const { return blocks_.empty(); }
  bool Contains(const IpAddress& a) const;
  // False for a text that is no address.
  bool Contains(std::string_view text) const;

 private:
  struct Block {
    IpAddress net;
    int bits = 128;  // of the 128 (an IPv4 block: 96 + its prefix)
  };
  std::vector<Block> blocks_;
};

// The PROXY protocol header at the start of a connection's bytes.
struct ProxyHeader {
  size_t length = 0;  // its bytes (the request starts after them)
  // The client (the connection's source) it names; nullopt when it names
  // none (v1 UNKNOWN, v2 LOCAL, an unspecified or UNIX family): the
  // connection is the proxy's own.
  std::optional<IpAddress> source;
  int source_port = 0;
};
enum class ProxyParse { kNeedMore, kDone, kMalformed };
// Parses the header `bytes` start with (kDone: `out` set); kNeedMore when
// they may be the start of one; kMalformed (with `why`) when they are not
// one: not a PROXY header at all, a v1 line over 107 bytes or with bad
// fields, a v2 header with a bad version, command, family or length.
ProxyParse ParseProxyHeader(std::string_view bytes, ProxyHeader& out, std::string& why);
// Whether the first bytes of a connection are (the start of) a PROXY
// header: "PROXY " (v1) or the v2 signature's first 5 bytes or more. No
// HTTP request starts so.
bool LooksLikeProxyHeader(std::string_view bytes);

// The values of every X-Forwarded-For field of a request head (the bytes
// up to its empty line, any case), in order, joined with ",". Empty when
// there is none.
std::string ForwardedForIn(std::string_view head);

// The client an X-Forwarded-For list names through trusted proxies: walking
// from the right (the entry the nearest proxy appended), the first address
// that is not a trusted proxy's; the leftmost when all are. Entries may be
// "a.b.c.d", "a.b.c.d:port", an IPv6 address, "[v6]" or "[v6]:port", with
// spaces around. kAbsent: an empty list. kMalformed (with `bad`, the
// offending entry, at most 64 bytes of it): an entry reached on that walk is
// not an address (a name, "unknown", an empty entry, garbage).
enum class ForwardedFor { kAbsent, kClient, kMalformed };
ForwardedFor ClientInForwardedFor(std::string_view list, const TrustedProxies& trusted, IpAddress& client,
                                  std::string& bad);

// Client text for a log line: at most 64 bytes, bytes outside printable
// ASCII as \xNN, in double quotes.
std::string QuotedForLog(std::string_view text);

}  // namespace idem::httplib::internal

#endif  // IDEM_SRC_HTTPLIB_CLIENT_ADDRESS_H_
