// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// Built against an installed idem with find_package(idem COMPONENTS pubsub open).
#include <cstdio>

#include "idem/open.h"
#include "idem/pubsub/publisher.h"
#include "idem/pubsub/source.h"

int main() {
  auto o = idem::pubsub::Source::ParseUrl("pubsub://shop/payments?endpoint=http://127.0.0.1:1&max_attempts=1");
  if (!o.ok() || o->subscription != "payments") return 1;
  auto s = idem::pubsub::Source::Open(*o);  // nothing listens on port 1
  std::printf("open: %s\n", s.status().ToString().c_str());
  if (s.ok() || s.status().code() != idem::Code::kUnavailable) return 2;
  auto p = idem::pubsub::Publisher::ParseUrl("pubsub://shop?topic=orders");
  if (!p.ok() || p->topic != "orders") return 3;
  for (const std::string& scheme : idem::SourceSchemes()) std::printf("source scheme: %s\n", scheme.c_str());
  auto via_open = idem::OpenSource("pubsub://shop/payments?endpoint=http://127.0.0.1:1&max_attempts=1");
  std::printf("open by URL: %s\n", via_open.status().ToString().c_str());
  return !via_open.ok() && via_open.status().code() == idem::Code::kUnavailable ? 0 : 4;
}
