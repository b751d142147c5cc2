// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/oracle.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
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
    IDEM_ASSIGN_OR_RETURN(std::vector<PaymentRow> rows, ReadPayments(store, kTable));
    for (const PaymentRow& row : rows) {
      ++c.effect_rows;
      ++applied[row.message_id];
      if (!row.charge_id.empty()) charge_ids.insert(row.charge_id);
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

namespace idem::cli::chaos {
namespace {

// A journal's lines, each split at its spaces (the event first).
std::vector<std::vector<std::string>> JournalLines(const std::filesystem::path& path) {
  std::vector<std::vector<std::string>> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (in.eof() || line.size() < 3) continue;  // a line cut by a kill
    std::vector<std::string> words;
    std::istringstream w(line);
    for (std::string word; w >> word;) words.push_back(word);
    out.push_back(std::move(words));
  }
  return out;
}

// "<slot>-<life>.log" -> (slot, life), to read a slot's lives in turn.
std::pair<int64_t, int64_t> SlotLife(const std::filesystem::path& p) {
  const std::string stem = p.stem().string();
  const size_t dash = stem.find('-');
  if (dash == std::string::npos) return {-1, -1};
  return {std::strtoll(stem.c_str(), nullptr, 10), std::strtoll(stem.c_str() + dash + 1, nullptr, 10)};
}

// Per key, the seqs in the order given: how many come below one seen
// before (the first occurrence of each seq counts).
int64_t Inversions(const std::vector<std::pair<std::string, int64_t>>& key_seq) {
  std::unordered_map<std::string, int64_t> top;
  std::unordered_map<std::string, std::unordered_set<int64_t>> seen;
  int64_t n = 0;
  for (const auto& [key, seq] : key_seq) {
    if (!seen[key].insert(seq).second) continue;
    auto [it, fresh] = top.emplace(key, seq);
    if (fresh) continue;
    if (seq < it->second) ++n;
    it->second = std::max(it->second, seq);
  }
  return n;
}

}  // namespace

Result<PipelineCheck> CheckPipeline(const Config& cfg, Store& store, Store& store2) {
  PipelineCheck c;
  auto example = [&c](const std::string& what, const std::string& id) {
    if (c.examples.size() < 20) c.examples.push_back(what + " " + id);
  };
  std::unordered_set<std::string> committed;  // stage-1 messages with an effect
  {
    IDEM_ASSIGN_OR_RETURN(std::vector<PaymentRow> rows, ReadPayments(store, kTable));
    for (const PaymentRow& row : rows) committed.insert(row.message_id);
  }
  c.expected = static_cast<int64_t>(committed.size());
  if (store.outbox_store() == nullptr) return Status::InvalidArgument("the store under test has no outbox");
  IDEM_ASSIGN_OR_RETURN(OutboxStats stats, store.outbox_store()->Stats());
  c.outbox_backlog = stats.backlog;
  c.outbox_dead_letters = stats.dead_letters;
  // Stage 2's effects, in the order applied.
  std::unordered_map<std::string, int64_t> per_outbox_id;
  std::unordered_map<std::string, std::unordered_set<std::string>> per_cause;   // stage-1 id -> outbox ids
  std::unordered_map<std::string, std::pair<std::string, int64_t>> key_seq_of;  // outbox id -> (key, seq)
  std::vector<std::pair<std::string, int64_t>> applied_order;
  {
    IDEM_ASSIGN_OR_RETURN(auto tx, store2.Begin());
    IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query(std::string("SELECT outbox_id, key, seq, causation_id FROM ") +
                                            kStage2Table + " ORDER BY n"));
    for (const auto& row : r.rows) {
      ++c.effects;
      const std::string id = row[0].AsText(), cause = row[3].AsText();
      ++per_outbox_id[id];
      per_cause[cause].insert(id);
      key_seq_of[id] = {row[1].AsText(), row[2].AsInt()};
      applied_order.emplace_back(row[1].AsText(), row[2].AsInt());
    }
  }
  for (const auto& [id, n] : per_outbox_id)
    if (n > 1) {
      ++c.duplicated;
      example("stage2-duplicated", id);
    }
  for (const auto& [cause, ids] : per_cause) {
    if (!committed.count(cause)) {
      c.unexpected += static_cast<int64_t>(ids.size());
      example("stage2-unexpected", cause);
    } else if (ids.size() > 1) {
      c.duplicated += static_cast<int64_t>(ids.size()) - 1;
      example("stage2-duplicated-cause", cause);
    }
  }
  for (const auto& id : committed)
    if (!per_cause.count(id)) {
      ++c.lost;
      example("stage2-lost", id);
    }
  c.applied = static_cast<int64_t>(per_outbox_id.size());
  c.stage2_reordered = Inversions(applied_order);
  // The relays' hand-overs, in time order.
  {
    IDEM_ASSIGN_OR_RETURN(auto journals, ListDir(cfg.dir + "/relay"));
    struct Handed {
      int64_t ns, seq;
      std::string key, id;
    };
    std::vector<Handed> handed;
    std::unordered_set<std::string> handed_ids, confirmed;
    for (const auto& journal : journals)
      for (const auto& w : JournalLines(journal)) {
        if (w[0] == "P" && w.size() == 5) {
          handed.push_back(
              {std::strtoll(w[4].c_str(), nullptr, 10), std::strtoll(w[3].c_str(), nullptr, 10), w[2], w[1]});
        } else if (w[0] == "K" && w.size() == 2) {
          confirmed.insert(w[1]);
        } else if (w[0] == "T" && w.size() == 3) {
          ++c.relay_lives_stopped;
          c.relay_stats_published += std::strtoll(w[1].c_str(), nullptr, 10);
          c.relay_stats_republished += std::strtoll(w[2].c_str(), nullptr, 10);
        }
      }
    std::stable_sort(handed.begin(), handed.end(),
                     [](const Handed& a, const Handed& b) { return a.ns != b.ns ? a.ns < b.ns : a.seq < b.seq; });
    std::vector<std::pair<std::string, int64_t>> order;
    for (const Handed& h : handed) {
      ++c.relay_handed;
      if (!handed_ids.insert(h.id).second) ++c.relay_republished;
      if (h.key != "-") order.emplace_back(h.key, h.seq);
    }
    c.relay_order_violations = Inversions(order);
    c.relay_published = static_cast<int64_t>(confirmed.size());
  }
  // Stage 2's journals: deliveries, duplicates absorbed, and (one consumer)
  // the order of first receipts.
  {
    IDEM_ASSIGN_OR_RETURN(auto journals, ListDir(cfg.dir + "/journal2"));
    std::sort(journals.begin(), journals.end(), [](const auto& a, const auto& b) { return SlotLife(a) < SlotLife(b); });
    std::vector<std::pair<std::string, int64_t>> received;
    for (const auto& journal : journals) {
      std::unordered_map<std::string, int64_t> handled, acked;
      for (const auto& w : JournalLines(journal)) {
        if (w.size() != 2) continue;
        if (w[0] == "R") {
          ++c.stage2_deliveries;
        } else if (w[0] == "D") {
          if (auto it = key_seq_of.find(w[1]); it != key_seq_of.end()) received.push_back(it->second);
        } else if (w[0] == "H") {
          ++handled[w[1]];
        } else if (w[0] == "A" || w[0] == "L") {
          ++acked[w[1]];
        }
      }
      for (const auto& [id, n] : acked) c.stage2_duplicates_absorbed += std::max<int64_t>(0, n - handled[id]);
    }
    // (A source that does not number its deliveries gives no first ones.)
    c.order_checked = cfg.stage2_consumers == 1 && !received.empty();
    if (c.order_checked) c.stage2_order_violations = Inversions(received);
  }
  return c;
}

}  // namespace idem::cli::chaos
