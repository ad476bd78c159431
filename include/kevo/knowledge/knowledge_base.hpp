// kevo/knowledge/knowledge_base.hpp: the default KnowledgeRetriever: markdown documents and learned
// skills in one SQLite FTS5 table, ranked by bm25 and picked by the search's signals within a
// token budget. A persistent database file keeps skills across runs.
//
//   auto kb = kevo::knowledge::KnowledgeBase::open({.database = "kevo.db", .folders = {"knowledge"}});
//   auto snippets = kb->retrieve({.target = kevo::Target::cpu, .bottleneck = kevo::Bottleneck::memory});
//   kb->learn(skill);   // a later run on kevo.db retrieves it
//   kb->withdraw(skill.problem, skill.node_key);   // its candidate was refused later: never retrieved again
//
// Why one file of about 490 lines: documents, skills and their facts live in one FTS5 database, and
// every query ranks them together.
#pragma once

#include <kevo/knowledge/document.hpp>
#include <kevo/knowledge/skill_facts.hpp>
#include <kevo/detail/json_writer.hpp>
#include <kevo/detail/sqlite.hpp>
#include <kevo/knowledge_retriever.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace kevo::knowledge {

using kevo::detail::SqliteHandle;
using kevo::detail::SqliteStatement;

/// A rough token count (about four characters per token for English and code), the unit of
/// KnowledgeQuery::token_budget.
inline std::size_t estimate_tokens(std::string_view text) { return (text.size() + 3) / 4; }

/// The tokens a snippet costs inside a prompt: its title and its text.
inline std::size_t snippet_tokens(const KnowledgeSnippet& s) { return estimate_tokens(s.title) + estimate_tokens(s.text); }

namespace detail {

inline const std::set<std::string_view>& stopwords() {
  static const std::set<std::string_view> words = {
      "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "in", "into", "is", "it", "its", "of",
      "on", "or", "that", "the", "this", "to", "was", "with", "not", "no", "near", "note", "const", "int", "float",
      "void", "auto", "std", "size", "line", "file", "cpp", "in", "function", "which", "each", "one", "all", "at",
      "when", "than", "then", "there", "these", "those", "will", "can", "do", "does", "did", "but", "if", "so"};
  return words;
}

/// Splits text into lowercase alphanumeric words, as FTS5's unicode61 tokenizer does.
inline std::vector<std::string> words_of(std::string_view text, std::size_t limit = 64) {
  std::vector<std::string> out;
  std::string word;
  auto flush = [&] {
    if (word.size() >= 2 && word.size() <= 40 && !stopwords().contains(word) &&
        !std::all_of(word.begin(), word.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      out.push_back(word);
    word.clear();
  };
  for (char c : text) {
    if (out.size() >= limit) break;
    if (std::isalnum(static_cast<unsigned char>(c))) word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    else flush();
  }
  if (out.size() < limit) flush();
  return out;
}

/// The lines of compiler output that say what is wrong, without the notes and code echoes.
inline std::string error_lines(std::string_view text, std::size_t max_lines = 6) {
  std::string out;
  std::size_t kept = 0;
  while (!text.empty() && kept < max_lines) {
    const std::size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (line.find("error") != std::string_view::npos || line.find("undefined reference") != std::string_view::npos) {
      // Drop the "path/file.cpp:12:5:" prefix: paths are noise to retrieval.
      const std::size_t tag = line.find("error");
      out.append(line.substr(tag == std::string_view::npos ? 0 : tag));
      out += '\n';
      ++kept;
    }
  }
  return out.empty() ? std::string(text.substr(0, 400)) : out;
}

inline std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const auto& s : items) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

inline bool list_contains(std::string_view list, std::string_view item) {
  for (const auto& s : parse_list(list))
    if (s == item) return true;
  return false;
}

}  // namespace detail

/// The words a signal adds to the full-text query, and the tag that marks documents about it.
inline std::vector<std::string> query_words(const KnowledgeQuery& q) {
  std::vector<std::string> words;
  auto add = [&](std::initializer_list<const char*> list) {
    for (const char* w : list) words.emplace_back(w);
  };
  switch (q.bottleneck) {
    case Bottleneck::memory: add({"memory", "bound", "bandwidth", "hierarchy", "cache", "coalescing", "prefetch", "locality"}); break;
    case Bottleneck::compute: add({"compute", "bound", "simd", "fma", "vectorization", "throughput", "tensor"}); break;
    case Bottleneck::latency: add({"latency", "bound", "parallelism", "dependency", "ilp"}); break;
    case Bottleneck::occupancy: add({"occupancy", "registers", "warps", "wavefront"}); break;
    case Bottleneck::unknown: break;
  }
  switch (q.failure) {
    case FailureKind::compile_error: add({"compile", "compiler", "error", "debugging"}); break;
    case FailureKind::wrong_answer: add({"wrong", "answer", "mismatch", "correctness", "tolerance"}); break;
    case FailureKind::unwritten_output: add({"unwritten", "output", "tail", "remainder", "poison"}); break;
    case FailureKind::crash: add({"crash", "segmentation", "bounds", "alignment"}); break;
    case FailureKind::timeout:
    case FailureKind::cpu_time_limit: add({"timeout", "loop", "quadratic"}); break;
    default: break;
  }
  for (auto& w : detail::words_of(detail::error_lines(q.error_text), 24)) words.push_back(std::move(w));
  for (auto& w : detail::words_of(q.operator_class, 8)) words.push_back(std::move(w));
  for (auto& w : detail::words_of(q.problem_words, 24)) words.push_back(std::move(w));
  std::vector<std::string> unique;
  for (auto& w : words)
    if (std::find(unique.begin(), unique.end(), w) == unique.end()) unique.push_back(std::move(w));
  return unique;
}

struct KnowledgeBaseOptions {
  std::string database = ":memory:";               ///< a file keeps learned skills across runs
  std::vector<std::filesystem::path> folders;      ///< each searched recursively for *.md
  std::size_t max_sections_per_document = 2;       ///< so one long document cannot fill the budget
  std::size_t max_skills_per_problem = 4;          ///< skills of one problem with different changes
  double min_relative_score = 0.1;                 ///< drop hits scoring below this share of the best
};

/// SQLite FTS5 knowledge base. Safe to call from several threads (calls are serialized).
class KnowledgeBase {
 public:
  /// Opens (or creates) the database and re-indexes the documents of `options.folders`; the
  /// skills already in the database are kept.
  static expected<KnowledgeBase, Error> open(KnowledgeBaseOptions options) {
    auto db = SqliteHandle::open(options.database);
    if (!db) return unexpected(db.error());
    KnowledgeBase kb(std::move(*db), std::move(options));
    if (auto r = kb.create_schema(); !r) return unexpected(r.error());
    for (const auto& folder : kb.options_.folders)
      if (auto r = kb.index_folder(folder); !r) return unexpected(r.error());
    return kb;
  }

  KnowledgeBase(KnowledgeBase&& other) noexcept : db_(std::move(other.db_)), options_(std::move(other.options_)) {}

  /// Indexes one more folder of documents (replacing what was indexed from the same paths).
  expected<std::size_t, Error> index_folder(const std::filesystem::path& folder) {
    auto docs = load_documents(folder);
    if (!docs) return unexpected(docs.error());
    std::lock_guard lock(mutex_);
    if (auto r = db_.exec("BEGIN"); !r) return unexpected(r.error());
    // Everything indexed from this folder before goes, so a deleted or renamed file leaves nothing behind.
    auto remove = db_.prepare("DELETE FROM kevo_knowledge WHERE source = 'document' AND substr(origin, 1, length(?1)) = ?1");
    auto insert = prepare_insert();
    if (!remove || !insert) {
      (void)db_.exec("ROLLBACK");
      return make_error(!remove ? remove.error().message : insert.error().message);
    }
    const std::string prefix = (folder / "").lexically_normal().generic_string();
    remove->bind(1, prefix);
    remove->step();
    remove->reset();
    std::size_t sections = 0;
    for (const auto& doc : *docs) {
      const std::string origin = (folder / doc.path).lexically_normal().generic_string();
      for (const auto& section : doc.sections) {
        const std::string title = section.heading.empty() ? doc.title : fmt::format("{}: {}", doc.title, section.heading);
        if (!insert_row(*insert, title, detail::join(doc.tags, " "), section.text, doc.category,
                        detail::join(section.targets.empty() ? doc.targets : section.targets, ","), detail::join(doc.architectures, ","),
                        "document", origin)) {
          const std::string why = db_.last_error();
          (void)db_.exec("ROLLBACK");
          return make_error(fmt::format("{}: cannot index ({})", origin, why));
        }
        ++sections;
      }
    }
    if (auto r = db_.exec("COMMIT"); !r) return unexpected(r.error());
    return sections;
  }

  /// The snippets the query's signals call for, best first, within `query.token_budget`.
  std::vector<KnowledgeSnippet> retrieve(const KnowledgeQuery& query) {
    std::vector<std::string> words = query_words(query);
    if (words.empty()) words = {"performance", "optimization", "memory", "compute"};
    std::string match;
    for (const auto& w : words) {
      if (!match.empty()) match += " OR ";
      match += '"' + w + '"';
    }

    std::lock_guard lock(mutex_);
    auto st = db_.prepare(
        "SELECT title, tags, body, category, targets, architectures, source, origin, "
        "bm25(kevo_knowledge, 4.0, 3.0, 1.0), facts.knob_diff FROM kevo_knowledge "
        "LEFT JOIN kevo_skill_facts AS facts ON facts.id = kevo_knowledge.rowid WHERE kevo_knowledge MATCH ?1 "
        "ORDER BY bm25(kevo_knowledge, 4.0, 3.0, 1.0) LIMIT 400");
    if (!st) return {};
    st->bind(1, match);

    struct Hit {
      KnowledgeSnippet snippet;
      std::string origin;
      std::string change;  ///< a skill's knob diff: skills that share it say the same thing
    };
    std::vector<Hit> hits;
    const std::string target(to_string(query.target));
    const std::string arch = detail::lowercase(query.architecture);
    const std::string bound_tag = query.bottleneck == Bottleneck::unknown ? "" : fmt::format("{}-bound", to_string(query.bottleneck));
    const std::string failure_tag = failure_tag_of(query.failure);
    const auto problem_words = detail::words_of(query.problem_words, 24);
    while (st->step() == SQLITE_ROW) {
      const std::string_view targets = st->text(4), architectures = st->text(5), tags = st->text(1);
      if (!targets.empty() && !detail::list_contains(targets, "any") && !detail::list_contains(targets, target)) continue;
      const bool arch_named = !arch.empty() && !architectures.empty() && architecture_matches(architectures, arch);
      if (!arch.empty() && !architectures.empty() && !arch_named) continue;

      const std::string category(st->text(3));
      const std::string_view source = st->text(6);
      // Relevance is bm25 (negated: lower is better there) plus fixed bonuses for structured
      // matches. The bonuses are added, not multiplied: words such as "memory" occur in most
      // documents, so their bm25 is near zero and a multiplier would not lift the right ones.
      double score = -st->real(8);
      auto has_tag = [&](std::string_view t) {
        return !t.empty() && std::string_view(tags).find(t) != std::string_view::npos;
      };
      if (has_tag(bound_tag)) score += 10;
      if (!failure_tag.empty() && has_tag(failure_tag)) score += 10;
      if (query.failure == FailureKind::compile_error && category.starts_with("optimization/debugging")) score += 20;
      if (query.failure != FailureKind::none && query.failure != FailureKind::compile_error &&
          (category.starts_with("correctness") || category.starts_with("optimization/debugging")))
        score += 8;
      if (arch_named) score += 10;  // written for exactly this chip
      if (source == "skill") {
        // A skill learned on this very problem is the most specific advice there is.
        std::size_t shared = 0;
        const std::string origin_lower = detail::lowercase(st->text(7));
        for (const auto& w : problem_words) shared += origin_lower.find(w) != std::string::npos;
        score += 10 + 10 * static_cast<double>(std::min<std::size_t>(shared, 3));
      }
      Hit hit;
      hit.snippet.title = std::string(st->text(0));
      hit.snippet.category = source == "skill" ? "skill" : category.substr(0, category.find('/'));
      hit.snippet.text = std::string(st->text(2));
      hit.snippet.score = score;
      hit.origin = std::string(st->text(7));
      if (source == "skill") hit.change = st->is_null(9) || st->text(9).empty() ? hit.snippet.text : std::string(st->text(9));
      hits.push_back(std::move(hit));
    }
    std::stable_sort(hits.begin(), hits.end(), [](const Hit& a, const Hit& b) { return a.snippet.score > b.snippet.score; });

    std::vector<KnowledgeSnippet> picked;
    std::map<std::string, std::size_t, std::less<>> per_origin;
    std::set<std::pair<std::string, std::string>> skill_changes;  // (problem, change) already picked
    std::size_t used = 0;
    const double floor = hits.empty() ? 0.0 : hits.front().snippet.score * options_.min_relative_score;
    for (auto& hit : hits) {
      if (hit.snippet.score < floor) break;  // padding a prompt with weak matches only dilutes it
      const std::size_t cost = snippet_tokens(hit.snippet);
      if (used + cost > query.token_budget) continue;  // a smaller, lower-ranked one may still fit
      const bool skill = hit.snippet.category == "skill";
      const std::size_t cap = skill ? options_.max_skills_per_problem : options_.max_sections_per_document;
      if (hit.origin.size() && per_origin[hit.origin] >= cap) continue;
      if (skill && !skill_changes.emplace(hit.origin, hit.change).second) continue;  // a near-duplicate
      ++per_origin[hit.origin];
      used += cost;
      picked.push_back(std::move(hit.snippet));
    }
    return picked;
  }

  /// Writes a skill back (category "skill"), with its facts. Skills are kept per improvement: a
  /// node learned twice is stored once; without a node key, identical texts of a problem are.
  void learn(const Skill& skill) { (void)store_skill(skill); }

  /// learn(), reporting failures instead of dropping them.
  expected<void, Error> store_skill(const Skill& skill) {
    std::string tags = fmt::format("skill {} {}", to_string(skill.target), detail::join(detail::words_of(skill.problem), " "));
    if (skill.bottleneck != Bottleneck::unknown) tags += fmt::format(" {}-bound", to_string(skill.bottleneck));
    for (const auto& [name, value] : skill.after) tags += " " + name;
    std::string body = skill.summary;
    const bool templated = !skill.before.empty() && !skill.after.empty();
    if (templated) body += fmt::format("\nKnobs before: {}\nKnobs after: {}", to_string(skill.before), to_string(skill.after));
    body += '\n' + provenance(skill);
    const std::string title = fmt::format("Skill learned on {} ({})", skill.problem, to_string(skill.target));

    std::lock_guard lock(mutex_);
    if (auto r = db_.exec("BEGIN IMMEDIATE"); !r) return unexpected(r.error());
    Transaction transaction(db_);
    auto known = skill.node_key != 0
                     ? db_.prepare("SELECT count(*) FROM kevo_skill_facts WHERE problem = ?1 AND node_key = ?2")
                     : db_.prepare("SELECT count(*) FROM kevo_knowledge WHERE source = 'skill' AND origin = ?1 AND body = ?2");
    if (!known) return unexpected(known.error());
    known->bind(1, skill.problem);
    if (skill.node_key != 0) known->bind(2, static_cast<long long>(skill.node_key));
    else known->bind(2, body);
    if (known->step() == SQLITE_ROW && known->integer(0) > 0) return {};

    auto insert = prepare_insert();
    if (!insert) return unexpected(insert.error());
    if (!insert_row(*insert, title, tags, body, "skill", std::string(to_string(skill.target)), "", "skill", skill.problem))
      return make_error(fmt::format("cannot store skill: {}", db_.last_error()));
    auto facts = db_.prepare(
        "INSERT INTO kevo_skill_facts(id, problem, node_key, target, bottleneck, knobs_before, knobs_after, knob_diff, "
        "improvement, speedup, summary) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)");
    if (!facts) return unexpected(facts.error());
    facts->bind(1, static_cast<long long>(sqlite3_last_insert_rowid(db_.get())));
    facts->bind(2, skill.problem);
    facts->bind(3, static_cast<long long>(skill.node_key));
    facts->bind(4, to_string(skill.target));
    facts->bind(5, to_string(skill.bottleneck));
    facts->bind(6, kevo::detail::knobs_to_json(skill.before));
    facts->bind(7, kevo::detail::knobs_to_json(skill.after));
    facts->bind(8, templated ? knob_diff(skill.before, skill.after) : std::string());
    facts->bind(9, skill.improvement);
    facts->bind(10, skill.speedup);
    facts->bind(11, skill.summary);
    if (facts->step() != SQLITE_DONE) return make_error(fmt::format("cannot store skill facts: {}", db_.last_error()));
    return transaction.commit();
  }

  /// Forgets the skill learned on `node_key` of `problem`, in this run and every later one: its
  /// candidate was refused after it was learned (by a re-check, say), so it teaches nothing.
  void withdraw(const std::string& problem, std::int64_t node_key) { (void)withdraw_skill(problem, node_key); }

  /// withdraw(), reporting failures. Withdrawing a skill never learned does nothing.
  expected<void, Error> withdraw_skill(std::string_view problem, std::int64_t node_key) {
    if (node_key == 0) return make_error("withdraw_skill: no node key, so no skill to name");
    std::lock_guard lock(mutex_);
    if (auto r = db_.exec("BEGIN IMMEDIATE"); !r) return unexpected(r.error());
    Transaction transaction(db_);
    for (const char* sql : {"DELETE FROM kevo_knowledge WHERE rowid IN "
                            "(SELECT id FROM kevo_skill_facts WHERE problem = ?1 AND node_key = ?2)",
                            "DELETE FROM kevo_skill_facts WHERE problem = ?1 AND node_key = ?2"}) {
      auto st = db_.prepare(sql);
      if (!st) return unexpected(st.error());
      st->bind(1, problem);
      st->bind(2, static_cast<long long>(node_key));
      if (st->step() != SQLITE_DONE) return make_error(fmt::format("cannot withdraw skill: {}", db_.last_error()));
    }
    return transaction.commit();
  }

  /// The skills learned on `problem` (on every problem when empty) with their facts, oldest first.
  /// Skills kept from a database file older than the facts have none, and are not listed.
  std::vector<Skill> skills(std::string_view problem = {}) {
    std::lock_guard lock(mutex_);
    auto st = db_.prepare(
        "SELECT problem, target, bottleneck, knobs_before, knobs_after, improvement, speedup, node_key, summary "
        "FROM kevo_skill_facts WHERE coalesce(?1, '') = '' OR problem = ?1 ORDER BY id");
    if (!st) return {};
    st->bind(1, problem);
    std::vector<Skill> out;
    while (st->step() == SQLITE_ROW) {
      Skill& s = out.emplace_back();
      s.problem = std::string(st->text(0));
      for (const Target t : {Target::cpu, Target::cuda, Target::hip})
        if (to_string(t) == st->text(1)) s.target = t;
      s.bottleneck = bottleneck_from_string(st->text(2));
      s.before = kevo::detail::knobs_from_json(st->text(3));
      s.after = kevo::detail::knobs_from_json(st->text(4));
      s.improvement = st->real(5);
      s.speedup = st->real(6);
      s.node_key = st->integer(7);
      s.summary = std::string(st->text(8));
    }
    return out;
  }

  /// How many sections and skills are indexed (for tests and a one-line report).
  std::size_t size(std::string_view source = {}) {
    std::lock_guard lock(mutex_);
    auto st = db_.prepare(source.empty() ? "SELECT count(*) FROM kevo_knowledge"
                                         : "SELECT count(*) FROM kevo_knowledge WHERE source = ?1");
    if (!st) return 0;
    if (!source.empty()) st->bind(1, source);
    return st->step() == SQLITE_ROW ? static_cast<std::size_t>(st->integer(0)) : 0;
  }

 private:
  KnowledgeBase(SqliteHandle db, KnowledgeBaseOptions options) : db_(std::move(db)), options_(std::move(options)) {}

  /// Rolls back unless committed, so that every early return leaves the database as it was.
  class Transaction {
   public:
    explicit Transaction(SqliteHandle& db) : db_(db) {}
    Transaction(const Transaction&) = delete;
    ~Transaction() {
      if (!committed_) (void)db_.exec("ROLLBACK");
    }
    expected<void, Error> commit() {
      committed_ = true;
      return db_.exec("COMMIT");
    }

   private:
    SqliteHandle& db_;
    bool committed_ = false;
  };

  expected<void, Error> create_schema() {
    // porter: "bound"/"bounded", "coalesce"/"coalescing" meet; the metadata columns are unindexed.
    if (auto r = db_.exec(
            "CREATE VIRTUAL TABLE IF NOT EXISTS kevo_knowledge USING fts5("
            "title, tags, body, category UNINDEXED, targets UNINDEXED, architectures UNINDEXED, "
            "source UNINDEXED, origin UNINDEXED, tokenize = 'porter unicode61')");
        !r)
      return r;
    // A skill's facts live in a side table keyed by its kevo_knowledge rowid, because an FTS5 table
    // cannot ALTER TABLE ADD COLUMN; creating it is the whole migration of an older file, whose
    // skills are kept and simply have no facts.
    return db_.exec(
        "CREATE TABLE IF NOT EXISTS kevo_skill_facts(id INTEGER PRIMARY KEY, problem TEXT NOT NULL, "
        "node_key INTEGER NOT NULL, target TEXT NOT NULL, bottleneck TEXT NOT NULL, knobs_before TEXT NOT NULL, "
        "knobs_after TEXT NOT NULL, knob_diff TEXT NOT NULL, improvement REAL NOT NULL, speedup REAL NOT NULL, "
        "summary TEXT NOT NULL);"
        "CREATE UNIQUE INDEX IF NOT EXISTS kevo_skill_node ON kevo_skill_facts(problem, node_key) WHERE node_key <> 0");
  }

  expected<SqliteStatement, Error> prepare_insert() {
    return db_.prepare(
        "INSERT INTO kevo_knowledge(title, tags, body, category, targets, architectures, source, origin) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
  }

  static bool insert_row(SqliteStatement& st, std::string_view title, std::string_view tags, std::string_view body,
                         std::string_view category, std::string_view targets, std::string_view architectures,
                         std::string_view source, std::string_view origin) {
    const std::array<std::string_view, 8> values{title, tags, body, category, targets, architectures, source, origin};
    for (std::size_t i = 0; i < values.size(); ++i) st.bind(static_cast<int>(i + 1), values[i]);
    const bool ok = st.step() == SQLITE_DONE;
    st.reset();
    return ok;
  }

  static std::string failure_tag_of(FailureKind f) {
    switch (f) {
      case FailureKind::compile_error: return "compile-error";
      case FailureKind::wrong_answer: return "wrong-answer";
      case FailureKind::unwritten_output: return "unwritten-output";
      case FailureKind::crash: return "crash";
      case FailureKind::timeout:
      case FailureKind::cpu_time_limit: return "timeout";
      default: return "";
    }
  }

  /// "sm_90a" matches a document listing "sm_90a" or "sm_90"; "x86-64" matches "x86_64" too.
  static bool architecture_matches(std::string_view list, const std::string& arch) {
    auto normal = [](std::string s) {
      std::replace(s.begin(), s.end(), '_', '-');
      return s;
    };
    const std::string want = normal(arch);
    for (const auto& a : detail::parse_list(list)) {
      const std::string have = normal(a);
      if (have == want || (want.starts_with(have) && want.size() == have.size() + 1)) return true;
    }
    return false;
  }

  SqliteHandle db_;
  KnowledgeBaseOptions options_;
  std::mutex mutex_;
};

static_assert(KnowledgeRetriever<KnowledgeBase>);
static_assert(kevo::detail::retriever_withdraws<KnowledgeBase>);

}  // namespace kevo::knowledge
