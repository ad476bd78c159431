// The GPU retrieval pipeline against the CPU reference, one file per facility beside this one:
// matching and towers, fused scoring (fp16 and int8), top-K, policies, the whole pipeline, batches,
// updates during search, the synthetic pool's targeting (their shared fixtures:
// ../support/pipeline_fixtures.cuh), and, on the host alone, the postings' bit layouts, scoring's
// routing tournament and the portability layer's plain paths (their own unit each once: issue 50).
// Every output buffer is poisoned first and every element is checked. Where no GPU exists, only
// the tests tagged [host] run, and it exits 77 (ctest: skipped) once they pass: a failing host test
// still fails.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "kevo/retrieval/portability.cuh"

using namespace kevo::retrieval;

int main(int argc, char** argv) {
  Catch::Session session;
  if (gpu_device_count() > 0) return session.run(argc, argv);
  std::puts("retrieval_pipeline.test: no GPU here, so only the [host] tests run");
  session.configData().testsOrTags = {"[host]"};
  const int failed = session.run();
  return failed == 0 ? 77 : failed;
}
