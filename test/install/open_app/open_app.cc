// Prints the schemes this program can open and what OpenSource says of a
// kafka:// URL (without connecting anywhere: a bad key).
#include <iostream>

#include "idem/open.h"

int main() {
  std::cout << "stores:";
  for (const std::string& s : idem::StoreSchemes()) std::cout << " " << s;
  std::cout << "\nsources:";
  for (const std::string& s : idem::SourceSchemes()) std::cout << " " << s;
  std::cout << "\nkafka: " << idem::OpenSource("kafka://127.0.0.1:1?topic=t&nosuchkey=1").status() << "\n";
  return 0;
}
