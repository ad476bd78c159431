// tests/support/quick_llm_options.hpp: a client's options for the fake LLM server (short timeouts,
// two attempts, fast backoff), with the test's key in a variable of its own.
#pragma once

#include <kevo/net/llm_client.hpp>

#include <support/fake_llm_server.hpp>

#include <chrono>
#include <cstdlib>

namespace kevo::testing {

/// Sets `key_variable` to `key` and returns options that reach `server` with it.
inline net::LlmClientOptions quick_llm_options(const LoopbackServer& server, const char* key_variable, const char* key) {
  using namespace std::chrono_literals;
  ::setenv(key_variable, key, 1);
  net::LlmClientOptions o;
  o.base_url = server.url() + "/v1";
  o.model = "kevo-test-model";
  o.api_key_env = key_variable;
  o.timeouts = {.connect = 2000ms, .write = 2000ms, .read = 5000ms, .request = 10'000ms};
  o.retry = {.max_attempts = 2, .initial_backoff = 20ms, .max_backoff = 100ms, .max_retry_after = 2000ms};
  o.jitter_seed = 7;
  return o;
}

}  // namespace kevo::testing
