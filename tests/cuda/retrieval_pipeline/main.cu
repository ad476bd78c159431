// The GPU retrieval pipeline against the CPU reference, one file per facility beside this one:
// matching and towers, fused scoring (fp16 and int8), top-K, policies, the whole pipeline, batches,
// and updates during search (their shared fixtures: ../support/pipeline_fixtures.cuh). Every output
// buffer is poisoned first and every element is checked. Exits 77 (ctest: skipped) where no GPU exists.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "kevo/retrieval/portability.cuh"

using namespace kevo::retrieval;

int main(int argc, char** argv) {
  if (gpu_device_count() == 0) {
    std::puts("retrieval_pipeline.test: no GPU here, skipping");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
