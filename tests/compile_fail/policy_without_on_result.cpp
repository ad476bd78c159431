// A user's policy that forgot on_result: SearchLoop must reject it, naming what is missing.
#include <kevo/search_loop.hpp>
#include <kevo/store/sqlite_store.hpp>

struct ForgetfulPolicy {
  kevo::Expansion select(const kevo::SearchTree& tree, kevo::Rng&) { return {tree.root()}; }
  void on_expand(const kevo::SearchTree&, kevo::NodeId) {}
#ifdef KEVO_CONTROL
  void on_result(const kevo::SearchTree&, kevo::NodeId) {}
#endif
};

static_assert(kevo::check_search_policy<ForgetfulPolicy>());

int main() {}
