// A serving binary's CPU half from the installed package, on kevo::retrieval alone: the CPU reference
// answers requests over a synthetic pool, and a tuning file round-trips (simdjson). run.cmake then
// checks with ldd that it links no SQLite, OpenSSL or libseccomp.
#include <kevo/retrieval/reference.hpp>  // ranks_before
#include <kevo/retrieval/retrieval.hpp>
#include <kevo/retrieval/tuning/tuning_file.hpp>
#include <kevo/retrieval/workload.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <vector>

int main() {
  namespace retrieval = kevo::retrieval;
  const retrieval::Workload workload({.seed = 7, .categories = 8, .dim = 64, .features = 32, .hidden = 32, .experts = 4});
  auto backend = retrieval::CpuRetrievalBackend::create(workload.schema(), workload.model(), 2);
  if (!backend) {
    std::printf("retrieval consumer: FAILED to create the CPU backend: %s\n", backend.error().message.c_str());
    return 1;
  }
  std::vector<retrieval::AdRecord> ads;
  for (std::uint64_t i = 0; i < 2000; ++i) ads.push_back(workload.ad(i));
  if (auto ok = (*backend)->upsert(ads); !ok) {
    std::printf("retrieval consumer: FAILED to upsert: %s\n", ok.error().message.c_str());
    return 1;
  }
  const auto top = (*backend)->search(workload.request(0, retrieval::RequestKind::broad, 10));
  if (!top || top->size() != 10 || !std::is_sorted(top->begin(), top->end(), retrieval::ranks_before)) {
    std::puts("retrieval consumer: FAILED: a broad request over 2000 ads did not answer its 10 best in order");
    return 1;
  }
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "kevo-retrieval-consumer-tuning.json";
  const retrieval::TuningFile written{.gpu = "no GPU: a CPU consumer", .cuda = "none"};
  const bool wrote = retrieval::write_tuning_file(file, written).has_value();
  const auto read = retrieval::read_tuning_file(file);
  std::filesystem::remove(file);
  if (!wrote || !read || read->gpu != written.gpu) {
    std::puts("retrieval consumer: FAILED: a tuning file did not read back as written");
    return 1;
  }
  std::printf("retrieval consumer: kevo::retrieval only; the best of 10 is ad %u\n", (*top)[0].id);
  return 0;
}
