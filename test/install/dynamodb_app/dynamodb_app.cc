// Built against the installed idem::dynamodb: parses a dynamodb:// URL,
// names dynamodb among the store schemes, and opens the store by URL where
// nothing listens (kUnavailable, after its bounded tries: no server needed).
#include <cstdlib>
#include <iostream>

#include "idem/dynamodb/items.h"
#include "idem/dynamodb/store.h"
#include "idem/inbox.h"
#include "idem/open.h"

int main() {
  idem::Handler charge = [](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
    return idem::dynamodb::ItemsOf(tx).Put("payments", {{"order_id", idem::dynamodb::Attr::S(m.id)}});
  };
  auto options = idem::dynamodb::Store::ParseUrl("dynamodb://orders-idem?region=eu-west-1&marker_ttl_s=86400");
  if (!options.ok() || options->table != "orders-idem" || options->marker_ttl_s != 86400) return 1;
  std::cout << "stores:";
  for (const std::string& s : idem::StoreSchemes()) std::cout << " " << s;
  std::cout << "\n";
  ::setenv("AWS_ACCESS_KEY_ID", "example", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "example", 1);
  auto store = idem::OpenStore("dynamodb://orders-idem?region=eu-west-1&endpoint=http://127.0.0.1:1&max_attempts=1");
  std::cout << "open: " << store.status() << "\n";
  return store.ok() || store.status().code() != idem::Code::kUnavailable || !charge ? 1 : 0;
}
