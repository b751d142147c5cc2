/* Copyright idem authors. SPDX-License-Identifier: Apache-2.0
 *
 * An LD_PRELOAD shim for servers that have no listen-address option (DynamoDB
 * Local): a bind() to the wildcard address (0.0.0.0, or :: on a dual-stack
 * socket) binds the loopback address instead (127.0.0.1, or ::ffff:127.0.0.1),
 * so the server is reachable only from this machine. Every other bind is
 * passed on unchanged. Built by scripts/test-dynamodb.sh.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  static int (*real_bind)(int, const struct sockaddr*, socklen_t);
  if (!real_bind) real_bind = (int (*)(int, const struct sockaddr*, socklen_t))dlsym(RTLD_NEXT, "bind");
  if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
    struct sockaddr_in a;
    memcpy(&a, addr, sizeof a);
    if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      return real_bind(fd, (const struct sockaddr*)&a, sizeof a);
    }
  } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
    struct sockaddr_in6 a;
    memcpy(&a, addr, sizeof a);
    if (IN6_IS_ADDR_UNSPECIFIED(&a.sin6_addr)) {
      static const unsigned char mapped_loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
      memcpy(&a.sin6_addr, mapped_loopback, 16);
      return real_bind(fd, (const struct sockaddr*)&a, sizeof a);
    }
  }
  return real_bind(fd, addr, len);
}
