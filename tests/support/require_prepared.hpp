// tests/support/require_prepared.hpp: REQUIRE that an evaluator's prepare() succeeds, showing its
// error when it does not.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#define REQUIRE_PREPARED(evaluator)                                \
  do {                                                             \
    auto prepared_ = (evaluator).prepare();                        \
    INFO((prepared_ ? std::string() : prepared_.error().message)); \
    REQUIRE(prepared_);                                            \
  } while (false)
