// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The CLI tests' outbox producer and its check:
//   outbox_fixture add STORE_URL N [DESTINATION]
//     adds N messages (ids ob-0..ob-N-1, three ordering keys) to the outbox
//     of a store, in one transaction;
//   outbox_fixture check SOURCE_URL N
//     receives (and acks) what the source holds and exits 0 when it is every
//     one of those ids, each once, in order within each key.
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include "idem/open.h"
#include "idem/outbox.h"

namespace {

int Check(const char* url, int n) {
  auto source = idem::OpenSource(url);
  if (!source.ok()) {
    std::cerr << source.status() << "\n";
    return 1;
  }
  std::set<std::string> seen;
  std::map<std::string, int> last;  // per key: the last index received
  for (;;) {
    auto got = (*source)->Receive(100, 200);
    if (!got.ok()) {
      std::cerr << got.status() << "\n";
      return 1;
    }
    if (got->empty()) break;
    for (const idem::Delivery& d : *got) {
      const int i = std::atoi(d.message.id.c_str() + 3);
      const std::string key = "k" + std::to_string(i % 3);
      if (d.message.id != "ob-" + std::to_string(i) || !seen.insert(d.message.id).second ||
          d.message.payload != "p" + std::to_string(i) || (last.count(key) && last[key] >= i)) {
        std::cerr << "unexpected, repeated or out of order: " << d.message.id << "\n";
        return 1;
      }
      last[key] = i;
      if (idem::Status s = (*source)->Ack(d); !s.ok()) {
        std::cerr << s << "\n";
        return 1;
      }
    }
  }
  if (static_cast<int>(seen.size()) != n) {
    std::cerr << "received " << seen.size() << " of " << n << " ids\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc < 4 || (mode != "add" && mode != "check")) {
    std::cerr << "usage: outbox_fixture add STORE_URL N [DESTINATION] | check SOURCE_URL N\n";
    return 2;
  }
  const int n = std::atoi(argv[3]);
  if (mode == "check") return Check(argv[2], n);
  auto store = idem::OpenStore(argv[2]);
  if (!store.ok()) {
    std::cerr << store.status() << "\n";
    return 1;
  }
  auto outbox = idem::Outbox::Open(**store);
  auto tx = (*store)->Begin();
  if (!outbox.ok() || !tx.ok()) {
    std::cerr << (outbox.ok() ? tx.status() : outbox.status()) << "\n";
    return 1;
  }
  for (int i = 0; i < n; ++i) {
    auto id = (*outbox)->Add(**tx, {.destination = argc > 4 ? argv[4] : "",
                                    .id = "ob-" + std::to_string(i),
                                    .key = "k" + std::to_string(i % 3),
                                    .payload = "p" + std::to_string(i)});
    if (!id.ok()) {
      std::cerr << id.status() << "\n";
      return 1;
    }
  }
  if (idem::Status s = (*tx)->Commit(); !s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return 0;
}
