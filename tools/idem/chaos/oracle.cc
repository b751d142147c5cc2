// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/oracle.h"

#include <unordered_map>
#include <unordered_set>

#include "chaos/workdir.h"
#include "cli.h"
#include "payments.h"

namespace idem::cli::chaos {

Result<EffectCheck> CheckEffects(const Config& cfg, Store& store) {
  EffectCheck c;
  std::unordered_map<std::string, std::string> oracle;    // id -> payload
  std::unordered_map<std::string, std::string> by_order;  // order -> id
  {
    std::ifstream in(cfg.dir + "/oracle.log");
    std::string id, payload;
    while (in >> id >> payload) {
      ++c.published;
      if (oracle.emplace(id, payload).second) {
        Message m;
        m.id = id;
        m.payload = payload;
        auto p = ParsePayment(m);
        if (!p.ok()) return p.status();
        by_order[p->first] = id;
        c.expected_cents += p->second;
      }
    }
  }
  c.unique = static_cast<int64_t>(oracle.size());
  auto example = [&c](const std::string& what, const std::string& id) {
    if (c.examples.size() < 20) c.examples.push_back(what + " " + id);
  };
  // Effects in the store under test.
  std::unordered_map<std::string, int64_t> applied;
  std::unordered_set<std::string> charge_ids;
  {
    IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
    IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query(std::string("SELECT message_id, charge_id, cents FROM ") + kTable));
    for (const auto& row : r.rows) {
      ++c.effect_rows;
      ++applied[row[0].AsText()];
      if (!row[1].is_null()) charge_ids.insert(row[1].AsText());
    }
  }
  for (const auto& [id, n] : applied) {
    if (!oracle.count(id)) {
      ++c.unexpected;
      example("unexpected", id);
    } else if (n > 1) {
      ++c.duplicated;
      example("duplicated", id);
    }
  }
  for (const auto& [id, payload] : oracle) {
    if (!applied.count(id)) {
      ++c.lost;
      example("lost", id);
    }
  }
  c.applied = static_cast<int64_t>(applied.size());
  // Effects at the provider: charges per order (its customer is "cus_<order>").
  {
    IDEM_ASSIGN_OR_RETURN(auto db, OpenStore(ProviderStore(cfg), false));
    IDEM_ASSIGN_OR_RETURN(auto tx, db->Begin());
    IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query("SELECT id, customer, amount FROM provider_charges"));
    std::unordered_map<std::string, int64_t> per_order;
    std::unordered_set<std::string> made;
    for (const auto& row : r.rows) {
      ++c.provider_charges;
      c.charged_cents += row[2].AsInt();
      made.insert(row[0].AsText());
      std::string order = row[1].AsText();
      if (order.starts_with("cus_")) order = order.substr(4);
      ++per_order[order];
    }
    for (const auto& [order, n] : per_order) {
      if (!by_order.count(order)) {
        ++c.provider_unexpected;
        example("provider-unexpected", order);
      } else if (n > 1) {
        ++c.provider_duplicated;
        example("provider-duplicated", by_order[order]);
      }
    }
    for (const auto& [order, id] : by_order)
      if (!per_order.count(order)) ++c.provider_missing;
    for (const auto& id : charge_ids)
      if (!made.count(id)) {
        ++c.effects_without_charge;
        example("charge-missing", id);
      }
  }
  // What the consumers acknowledged, from their journals.
  std::unordered_set<std::string> acked;
  IDEM_ASSIGN_OR_RETURN(auto journals, ListDir(cfg.dir + "/journal"));
  for (const auto& journal : journals) {
    std::ifstream in(journal);
    std::string line;
    while (std::getline(in, line)) {
      if (line.size() < 3) continue;  // a line cut by a kill
      const std::string id = line.substr(2);
      switch (line[0]) {
        case 'R': ++c.deliveries; break;
        case 'S': ++c.stalls; break;
        case 'L':
          ++c.lost_acks;
          acked.insert(id);
          break;
        case 'A': acked.insert(id); break;
        case 'F': ++c.vfs_faults_fired; break;
        case 'X': ++c.fenced; break;
        case 'C': ++c.clock_jumps_seen; break;
        default: break;
      }
    }
  }
  for (const auto& id : acked)
    if (!applied.count(id)) {
      ++c.acked_not_committed;
      example("acked-not-committed", id);
    }
  {
    std::ifstream in(cfg.dir + "/provider.log");
    std::string line;
    while (std::getline(in, line))
      if (line.find("outcome=response-dropped") != std::string::npos) ++c.lost_responses;
  }
  return c;
}

}  // namespace idem::cli::chaos
