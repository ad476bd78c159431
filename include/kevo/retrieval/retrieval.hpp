// kevo/retrieval/retrieval.hpp: the host side of kevo's retrieval pipeline in one include (no CUDA).
// The GPU pipeline is kevo/retrieval/dispatch/fused_retrieval_pipeline.cuh, for .cu translation units.
//
//   #include "kevo/retrieval/retrieval.hpp"
//   kevo::retrieval::CpuRetrievalBackend backend(schema, model);
//   auto top = backend.search(request);
#pragma once

#include "kevo/retrieval/ad_file.hpp"
#include "kevo/retrieval/ad_pool.hpp"
#include "kevo/retrieval/backend.hpp"
#include "kevo/retrieval/fair_mutex.hpp"
#include "kevo/retrieval/half.hpp"
#include "kevo/retrieval/reference.hpp"
#include "kevo/retrieval/safetensors.hpp"
#include "kevo/retrieval/slot_order.hpp"
#include "kevo/retrieval/tuning/policies.hpp"
#include "kevo/retrieval/types.hpp"
#include "kevo/retrieval/weighted_rounding.hpp"
#include "kevo/retrieval/workload.hpp"
