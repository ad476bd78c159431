// Ads handed in as an int8 pool's stored form (AdRecord::quantized), for the host's and the
// device's tests: a form the pool's own quantize() would not produce, so that a pool that
// quantised the ad again, instead of keeping what it was given, stores something else.
#pragma once

#include <cmath>
#include <cstdint>

#include "kevo/retrieval/ad_pool.hpp"

namespace kevo_tests {

/// The ad's embedding quantised by the pool's rule, then narrowed to q in [-90, 90] with each
/// scale widened to match (an fp16 value for int8_group32): the same values to within rounding,
/// stored differently. The ad's `embedding` is cleared; `quantized` holds the form.
inline kevo::retrieval::AdRecord handed_in_quantized(kevo::retrieval::EmbeddingType type, kevo::retrieval::AdRecord ad) {
  using namespace kevo::retrieval;
  QuantizedEmbedding q = quantize(type, ad.embedding);
  for (std::size_t k = 0; k < q.values.size(); ++k)
    q.values[k] = static_cast<std::int8_t>(std::lround(q.values[k] * 90.0 / 127.0));
  for (float& scale : q.scales) {
    scale = scale * 127.0f / 90.0f;
    if (type == EmbeddingType::int8_group32) scale = round_to_half(scale);
  }
  ad.embedding.clear();
  ad.quantized = std::move(q);
  return ad;
}

}  // namespace kevo_tests
