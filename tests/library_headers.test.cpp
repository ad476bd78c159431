// The kevo headers a problem names for its candidates: found under an include root with the kevo
// headers they include, and a missing one named with the root it was looked for in.
#include <kevo/eval/library_headers.hpp>

#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace kevo_tests::library_headers_test {

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// A temporary include root, removed with what it holds.
struct TemporaryRoot {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("kevo-test-include-root-" + std::to_string(::getpid()));
  TemporaryRoot() {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path / "kevo");
  }
  ~TemporaryRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  void write(const std::string& name, const std::string& text) const {
    std::filesystem::create_directories((path / name).parent_path());
    std::ofstream(path / name) << text;
  }
};

}  // namespace

TEST_CASE("a library header's closure holds it and the kevo headers it includes, not the standard library's") {
  TemporaryRoot root;
  const std::string a = "#pragma once\n#include <cstdint>\n  #  include \"kevo/b.hpp\"\n// #include \"kevo/commented.hpp\"\nint a();\n";
  const std::string b = "#pragma once\n#include \"kevo/a.hpp\"\nint b();\n";  // a cycle is read once
  root.write("kevo/a.hpp", a);
  root.write("kevo/b.hpp", b);
  auto closure = kevo::eval::library_header_closure(root.path, {"kevo/a.hpp"});
  INFO((closure ? "" : closure.error().message));
  REQUIRE(closure);
  REQUIRE(closure->size() == 2);
  CHECK((*closure)[0].path == "kevo/a.hpp");
  CHECK((*closure)[0].content == a);
  CHECK((*closure)[1].path == "kevo/b.hpp");
  CHECK((*closure)[1].content == b);
  CHECK(kevo::eval::library_header_closure(root.path, {})->empty());
}

TEST_CASE("a missing library header, named or included, is an error naming it, the root and how to set it") {
  TemporaryRoot root;
  root.write("kevo/a.hpp", "#pragma once\n#include \"kevo/gone.hpp\"\n");
  for (const std::string name : {"kevo/a.hpp", "kevo/absent.hpp"}) {
    auto closure = kevo::eval::library_header_closure(root.path, {name});
    REQUIRE_FALSE(closure);
    const std::string& message = closure.error().message;
    INFO(message);
    CHECK(contains(message, name == "kevo/a.hpp" ? "kevo/gone.hpp (included by kevo/a.hpp)" : "kevo/absent.hpp"));
    CHECK(contains(message, root.path.string()));
    CHECK(contains(message, "KEVO_INCLUDE_DIR"));
    CHECK(contains(message, "library_include_dir"));
  }
  // An include that would leave kevo/ in the copy is refused as a name in the manifest is.
  root.write("kevo/escape.hpp", "#include \"kevo/../../etc/passwd\"\n");
  auto escape = kevo::eval::library_header_closure(root.path, {"kevo/escape.hpp"});
  REQUIRE_FALSE(escape);
  CHECK(contains(escape.error().message, "'..'"));
  auto no_root = kevo::eval::library_header_closure({}, {"kevo/a.hpp"});
  REQUIRE_FALSE(no_root);
  CHECK(contains(no_root.error().message, "KEVO_INCLUDE_DIR"));
}

TEST_CASE("kevo's include root: the configured one, else KEVO_INCLUDE_DIR, else the headers this test was built against") {
  const std::filesystem::path source_root = std::filesystem::path(KEVO_SOURCE_DIR) / "include";
  CHECK(kevo::eval::library_include_root("/configured") == "/configured");
  const char* saved = std::getenv("KEVO_INCLUDE_DIR");
  const std::string previous = saved ? saved : "";
  ::setenv("KEVO_INCLUDE_DIR", "/from/the/environment", 1);
  CHECK(kevo::eval::library_include_root() == "/from/the/environment");
  ::setenv("KEVO_INCLUDE_DIR", "", 1);
  const std::filesystem::path found = kevo::eval::library_include_root();
  if (saved) ::setenv("KEVO_INCLUDE_DIR", previous.c_str(), 1);
  else ::unsetenv("KEVO_INCLUDE_DIR");
  REQUIRE_FALSE(found.empty());
  CHECK(std::filesystem::equivalent(found, source_root));
  // The real agent header's closure is there, kevo's own includes and all.
  auto closure = kevo::eval::library_header_closure(found, {"kevo/retrieval/agent/scoring.cuh"});
  INFO((closure ? "" : closure.error().message));
  REQUIRE(closure);
  CHECK(closure->size() > 1);
}

}  // namespace kevo_tests::library_headers_test
