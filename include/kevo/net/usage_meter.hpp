// kevo/net/usage_meter.hpp: tokens and cost of a run, and the budget that ends it.
//
//   kevo::net::UsageMeter meter({.max_total_tokens = 200'000}, {.input_per_million = 3, .output_per_million = 15});
//   meter.record({.input_tokens = 1200, .output_tokens = 800});
//   if (meter.exhausted()) stop_the_search();
#pragma once

#include <kevo/net/chat.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace kevo::net {

/// Prices in US dollars per million tokens (0: not tracked).
struct Pricing {
  double input_per_million = 0;
  double output_per_million = 0;
};

/// Limits for a run (0: unlimited). A request starts only while both hold, so a run overshoots by
/// at most the answers already in flight.
struct Budget {
  std::uint64_t max_total_tokens = 0;
  double max_cost_usd = 0;
};

struct UsageReport {
  std::uint64_t requests = 0;          ///< answered successfully
  std::uint64_t failed_requests = 0;
  std::uint64_t retries = 0;
  std::uint64_t input_tokens = 0;
  std::uint64_t output_tokens = 0;
  double cost_usd = 0;

  std::uint64_t total_tokens() const { return input_tokens + output_tokens; }
};

inline std::string to_string(const UsageReport& u) {
  std::string s = fmt::format("{} requests ({} failed, {} retries), {} input + {} output tokens", u.requests,
                              u.failed_requests, u.retries, u.input_tokens, u.output_tokens);
  if (u.cost_usd > 0) s += fmt::format(", ${:.4f}", u.cost_usd);
  return s;
}

/// Thread-safe accounting shared by every request of a run.
class UsageMeter {
 public:
  explicit UsageMeter(Budget budget = {}, Pricing pricing = {}) : budget_(budget), pricing_(pricing) {}

  void record(const TokenUsage& usage) {
    std::lock_guard lock(mutex_);
    ++report_.requests;
    report_.input_tokens += usage.input_tokens;
    report_.output_tokens += usage.output_tokens;
    report_.cost_usd += (static_cast<double>(usage.input_tokens) * pricing_.input_per_million +
                         static_cast<double>(usage.output_tokens) * pricing_.output_per_million) / 1e6;
  }
  void record_failure() {
    std::lock_guard lock(mutex_);
    ++report_.failed_requests;
  }
  void record_retry() {
    std::lock_guard lock(mutex_);
    ++report_.retries;
  }

  /// Why no further request may start, or nullopt while the budget holds.
  std::optional<std::string> exhaustion() const {
    std::lock_guard lock(mutex_);
    if (budget_.max_total_tokens > 0 && report_.total_tokens() >= budget_.max_total_tokens)
      return fmt::format("token budget exhausted ({} of {} tokens used)", report_.total_tokens(), budget_.max_total_tokens);
    if (budget_.max_cost_usd > 0 && report_.cost_usd >= budget_.max_cost_usd)
      return fmt::format("cost budget exhausted (${:.4f} of ${:.4f})", report_.cost_usd, budget_.max_cost_usd);
    return std::nullopt;
  }
  bool exhausted() const { return exhaustion().has_value(); }

  UsageReport report() const {
    std::lock_guard lock(mutex_);
    return report_;
  }

 private:
  mutable std::mutex mutex_;
  Budget budget_;
  Pricing pricing_;
  UsageReport report_;
};

}  // namespace kevo::net
