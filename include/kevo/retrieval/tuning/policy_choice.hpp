// kevo/retrieval/tuning/policy_choice.hpp: what the pipeline asks when it is created without a
// policy: which policy suits this device and this pool, and where that answer came from. The
// answer comes from a chooser the caller hands over (tuning_file.hpp's tuned_policies reads a
// tuning file); this header stays free of fmt and JSON so that nvcc can compile the pipeline.
#pragma once

#include <kevo/retrieval/slot_order.hpp>
#include <kevo/retrieval/tuning/policies.hpp>
#include <kevo/retrieval/types.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

namespace kevo::retrieval {

/// Pools are tuned per decade of size: 1M, 10M, 100M, 1000M ads (log10 rounded).
inline int pool_class(std::uint64_t ads) {
  const double decade = std::round(std::log10(static_cast<double>(std::max<std::uint64_t>(ads, 1))));
  return static_cast<int>(std::clamp(decade, 0.0, 12.0));
}
inline std::string pool_class_name(int decade) {
  return decade >= 9 ? std::to_string(static_cast<long long>(std::pow(10, decade - 9))) + "G"
         : decade >= 6 ? std::to_string(static_cast<long long>(std::pow(10, decade - 6))) + "M"
                       : std::to_string(static_cast<long long>(std::pow(10, decade)));
}

/// What a policy is tuned for, beside the device: the pool's d, its dtype, its size class, and the
/// order its ads were loaded in (which sets how long the runs of eligible slots are that scoring
/// gathers: its best policy differs between the orders).
struct ShapeClass {
  int dim = 128;
  EmbeddingType dtype = EmbeddingType::fp16;
  int pool_decade = 8;  // pool_class(N)
  SlotOrder load_order = SlotOrder::by_id;
  friend bool operator==(const ShapeClass&, const ShapeClass&) = default;
};
inline std::string to_string(const ShapeClass& s) {
  return "d = " + std::to_string(s.dim) + ", " + to_string(s.dtype) + ", ~" + pool_class_name(s.pool_decade) + " ads, loaded by " +
         std::string(to_string(s.load_order));
}

/// The device a choice is made for.
struct DeviceIdentity {
  std::string gpu;   ///< the device name, as the runtime reports it ("NVIDIA H200")
  std::string cuda;  ///< the runtime's version ("13.0")
};

/// The policy a pipeline serves with, and a line that says where each stage's came from.
struct PolicyChoice {
  PipelinePolicy policy;
  bool tuned = false;
  std::string reason;  ///< why the defaults, where not tuned
  std::string origin;  ///< the whole line: "tuned for ...: <policy>" or "defaults (<reason>): <policy>"
};

using PolicyChooser = std::function<PolicyChoice(const DeviceIdentity&, const ShapeClass&)>;

}  // namespace kevo::retrieval
