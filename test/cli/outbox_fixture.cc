// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The CLI tests' producer: adds N messages (ids ob-0..ob-N-1, three ordering
// keys) to the outbox of a store, in one transaction.
// usage: outbox_fixture STORE_URL N [DESTINATION]
#include <cstdlib>
#include <iostream>
#include <string>

#include "idem/open.h"
#include "idem/outbox.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: outbox_fixture STORE_URL N [DESTINATION]\n";
    return 2;
  }
  const int n = std::atoi(argv[2]);
  auto store = idem::OpenStore(argv[1]);
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
    auto id = (*outbox)->Add(**tx, {.destination = argc > 3 ? argv[3] : "",
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
