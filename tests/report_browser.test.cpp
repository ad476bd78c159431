// The HTML reports as a person sees them: rendered by a real browser (headless Chromium), and the
// screenshot's pixels checked for the charts and the tree, with the page's rendered text.
// Without `chromium` on PATH (or without libpng to read its screenshots) the tests warn and pass.
#include <kevo/default_search_loop.hpp>
#include <kevo/report/comparison_report.hpp>
#include <kevo/report/html_report.hpp>
#include <kevo/search/any_policy.hpp>
#include <kevo/store/sqlite_store.hpp>

#include "support/synthetic_evaluator.hpp"

#include <catch2/catch.hpp>

#if KEVO_TEST_HAVE_PNG
#include <png.h>
#endif

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace kevo_tests::report_browser_test {

using namespace kevo;
namespace fs = std::filesystem;

namespace {

/// Where chromium is, or empty: Debian's package installs /usr/bin/chromium.
fs::path find_chromium() {
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');)
      if (!dir.empty() && ::access((fs::path(dir) / "chromium").c_str(), X_OK) == 0) return fs::path(dir) / "chromium";
  }
  return {};
}

/// Whether this machine can run these tests; if not, says why (as other tests do when a tool is missing).
bool browser_available() {
#if !KEVO_TEST_HAVE_PNG
  WARN("libpng was not found when this test was built: the report is not checked in a browser (scripts/install-deps installs it)");
  return false;
#endif
  if (find_chromium().empty()) {
    WARN("no chromium on PATH: the report is not checked in a browser (scripts/install-deps installs Debian's chromium)");
    return false;
  }
  return true;
}

/// A directory of this test case's files, per build tree (two build trees may run at once), kept
/// after the test so that a person can look at the screenshots.
fs::path case_directory(std::string_view name) {
  const auto tree = std::hash<std::string>{}(fs::read_symlink("/proc/self/exe").string());
  fs::path dir = fs::temp_directory_path() / fmt::format("kevo-report-browser-{:08x}", tree & 0xffffffff) / std::string(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// Chromium, headless, as CI runs it: as root (so no sandbox), without a GPU, without D-Bus; its
/// chatter on stderr goes to a log beside the page. `timeout` ends a browser that hangs.
std::string run_chromium(const fs::path& dir, const std::string& flags, const fs::path& page) {
  static int profile = 0;
  const std::string command = fmt::format(
      "timeout -s KILL 60 '{}' --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars "
      "--force-device-scale-factor=1 --user-data-dir='{}' {} 'file://{}' 2>>'{}'",
      find_chromium().string(), (dir / fmt::format("profile-{}", profile++)).string(), flags, fs::absolute(page).string(),
      (dir / "chromium.log").string());
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe);
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = ::pclose(pipe);
  fs::remove_all(dir / fmt::format("profile-{}", profile - 1));  // a few MB a run, and nothing to look at
  INFO(command << "\nchromium's log: " << (dir / "chromium.log").string());
  REQUIRE(status == 0);
  return out;
}

struct Box {
  int left = 0, top = 0, width = 0, height = 0;
};

/// What the browser laid out: each <svg>'s box, the page's height and its rendered text (innerText:
/// what a person reads, not the markup). A copy of the page with a script that reads them into a
/// hidden element, which --dump-dom prints; the script changes no layout.
struct Layout {
  std::vector<Box> charts;
  int page_height = 0;
  std::string text;
};

Layout lay_out(const fs::path& dir, const fs::path& page, int width) {
  std::ifstream in(page);
  std::string html((std::istreambuf_iterator<char>(in)), {});
  const auto body_end = html.rfind("</body>");
  REQUIRE(body_end != std::string::npos);
  html.insert(body_end, R"(<script>
const boxes = Array.from(document.querySelectorAll('svg')).map(s => { const b = s.getBoundingClientRect();
  return [b.left, b.top, b.width, b.height].map(Math.round).join(' '); });
const probe = document.createElement('pre'); probe.id = 'kevo-probe'; probe.hidden = true;
probe.textContent = document.documentElement.scrollHeight + '\n' + boxes.join('\n') + '\n@@\n' + document.body.innerText;
document.body.appendChild(probe);
</script>)");
  const fs::path probed = dir / (page.stem().string() + ".probe.html");
  std::ofstream(probed) << html;
  const std::string dom = run_chromium(dir, fmt::format("--window-size={},1000 --dump-dom", width), probed);
  const auto start = dom.find('>', dom.find("id=\"kevo-probe\""));
  const auto end = dom.find("</pre>", start);
  INFO(dom.substr(0, 2000));
  REQUIRE(start != std::string::npos);
  REQUIRE(end != std::string::npos);
  std::stringstream probe(dom.substr(start + 1, end - start - 1));
  Layout layout;
  probe >> layout.page_height;
  probe.ignore();
  for (std::string line; std::getline(probe, line) && line != "@@";) {
    Box b;
    std::stringstream(line) >> b.left >> b.top >> b.width >> b.height;
    layout.charts.push_back(b);
  }
  layout.text.assign(std::istreambuf_iterator<char>(probe), {});
  return layout;
}

/// A screenshot, as RGB rows.
struct Image {
  int width = 0, height = 0;
  std::vector<unsigned char> rgb;
  const unsigned char* at(int x, int y) const { return &rgb[3 * (std::size_t(y) * width + x)]; }
};

/// The page, drawn by Chromium in a window as tall as the page and read back with libpng.
Image screenshot(const fs::path& dir, const fs::path& page, int width, int height, const fs::path& png) {
  run_chromium(dir, fmt::format("--window-size={},{} --screenshot='{}'", width, height, png.string()), page);
  Image image;
#if KEVO_TEST_HAVE_PNG
  png_image decoded{};
  decoded.version = PNG_IMAGE_VERSION;
  REQUIRE(png_image_begin_read_from_file(&decoded, png.c_str()) != 0);
  decoded.format = PNG_FORMAT_RGB;
  image.width = int(decoded.width), image.height = int(decoded.height);
  image.rgb.resize(PNG_IMAGE_SIZE(decoded));
  REQUIRE(png_image_finish_read(&decoded, nullptr, image.rgb.data(), 0, nullptr) != 0);
#endif
  return image;
}

/// Pixels inside `box` within `tolerance` (per channel) of the colour `hex` ("#4477aa").
std::size_t count_near(const Image& image, const Box& box, std::string_view hex, int tolerance) {
  const int target[3] = {std::stoi(std::string(hex.substr(1, 2)), nullptr, 16), std::stoi(std::string(hex.substr(3, 2)), nullptr, 16),
                         std::stoi(std::string(hex.substr(5, 2)), nullptr, 16)};
  std::size_t n = 0;
  for (int y = std::max(box.top, 0); y < std::min(box.top + box.height, image.height); ++y)
    for (int x = std::max(box.left, 0); x < std::min(box.left + box.width, image.width); ++x) {
      const unsigned char* p = image.at(x, y);
      if (std::abs(p[0] - target[0]) <= tolerance && std::abs(p[1] - target[1]) <= tolerance && std::abs(p[2] - target[2]) <= tolerance)
        ++n;
    }
  return n;
}

/// Pixels inside `box` of a green that the tree gives a correct node (speed_colour's far end, and
/// not its grey start): green well above red and blue.
std::size_t count_green_nodes(const Image& image, const Box& box) {
  std::size_t n = 0;
  for (int y = std::max(box.top, 0); y < std::min(box.top + box.height, image.height); ++y)
    for (int x = std::max(box.left, 0); x < std::min(box.left + box.width, image.width); ++x) {
      const unsigned char* p = image.at(x, y);
      if (p[1] > p[0] + 40 && p[1] > p[2] + 40) ++n;
    }
  return n;
}

constexpr int page_width = 1000;
// Per-channel tolerance for a colour "drawn": anti-aliased edges blend into white, the cores do not.
constexpr int tolerance = 24;

/// The page rendered: its layout (the charts' boxes, its text) and its screenshot, whose path the
/// test prints for a person to look at.
struct Rendered {
  Layout layout;
  Image image;
  fs::path png;
};

Rendered render(const fs::path& dir, const std::string& html, std::size_t charts) {
  const fs::path page = dir / "report.html";
  std::ofstream(page) << html;
  Rendered r{lay_out(dir, page, page_width), {}};
  REQUIRE(r.layout.charts.size() == charts);
  for (const Box& b : r.layout.charts) REQUIRE(b.width > 100);
  // A window as tall as the page: the screenshot holds all of it, laid out as it was probed.
  r.png = dir / "report.png";
  r.image = screenshot(dir, page, page_width, r.layout.page_height, r.png);
  std::printf("screenshot: %s\n", r.png.c_str());  // for `ctest -V`; INFO names it where a check fails
  REQUIRE(r.image.width == page_width);
  REQUIRE(r.image.height == r.layout.page_height);
  return r;
}

/// A run of the synthetic problem under the named policy, as kevo-search records it: one job, so
/// that a seed makes the same run every time (with two, which finishes first decides the path).
SearchResult run_search(store::SqliteStore& store, std::string_view policy_name, std::size_t evaluations, std::uint64_t seed) {
  const Problem problem = kevo::testing::synthetic_problem();
  kevo::testing::SyntheticEvaluator evaluator;
  auto policy = search::make_policy(policy_name);
  REQUIRE(policy);
  SearchLoop<synth::TemplateSynthesizer, search::AnyPolicy, memory::Adaptive, kevo::testing::SyntheticEvaluator,
             knowledge::NullRetriever, store::SqliteStore>
      loop(problem, synth::TemplateSynthesizer(problem), std::move(*policy), memory::Adaptive{}, evaluator,
           knowledge::NullRetriever{}, store,
           SearchArguments{.jobs = 1, .max_evaluations = evaluations, .seed = seed, .warm_start = 0,
                           .settings_json = fmt::format(R"({{"policy":"{}"}})", policy_name)});
  auto result = loop.run(loop.synthesizer().seed());
  REQUIRE(result);
  return std::move(*result);
}

}  // namespace

TEST_CASE("a browser draws the report's progress chart, failures and tree, and shows the verified figure", "[report][browser]") {
  if (!browser_available()) return;
  auto store = store::SqliteStore::open(":memory:").value();
  const SearchResult result = run_search(store, "mcts", 30, 3);
  REQUIRE(result.verified);
  std::size_t failed = 0;
  for (const auto& [kind, n] : result.failures) failed += n;
  REQUIRE(failed > 0);  // the synthetic landscape fails knob c = 3: the chart must show a red x
  const std::size_t correct = 31 - failed;

  const fs::path dir = case_directory("run");
  const Rendered page = render(dir, report::render_html(store, result.run_id).value(), 2);
  INFO("screenshot: " << page.png.string());
  const Box& progress = page.layout.charts[0];
  const Box& tree = page.layout.charts[1];
  // The best-so-far line crosses the whole chart (700 px wide, 2 px thick: well over 600 px of it
  // are its own green); each correct evaluation's dot is some 28 px of blue, partly under the line.
  CHECK(count_near(page.image, progress, "#228833", tolerance) > 600);
  CHECK(count_near(page.image, progress, "#4477aa", tolerance) > 8 * correct);
  // Each failure is a red "x", some 11 px tall: a few of its pixels are the red itself.
  CHECK(count_near(page.image, progress, "#cc3311", 60) >= 3 * failed);
  // The tree: every correct node a grey-to-green disc (the best the deep green), every failure red.
  CHECK(count_near(page.image, tree, "#1e9632", tolerance) > 30);  // speed_colour(best, best): rgb(30,150,50)
  CHECK(count_green_nodes(page.image, tree) > 40);
  CHECK(count_near(page.image, tree, "#cc3311", tolerance) > 20 * failed);
  // ...and the figures stay apart: the tree has no progress dots, the chart no tree discs.
  CHECK(count_near(page.image, tree, "#4477aa", tolerance) == 0);

  // What a person reads: the verified figure and the best node, as the console gives them.
  CHECK_THAT(page.layout.text, Catch::Contains(fmt::format("best {:.2f}x over the reference (verified: node {},",
                                                           result.verified_speedup, result.best_key)));
  CHECK_THAT(page.layout.text, Catch::Contains(fmt::format("The best kernel (node {})", result.best_key)));
}

TEST_CASE("a browser draws no progress dots for a run without a correct evaluation", "[report][browser]") {
  if (!browser_available()) return;
  // A run all of whose candidates failed, recorded as the loop records one.
  auto store = store::SqliteStore::open(":memory:").value();
  const auto run = store.begin_run({.problem = "synthetic", .settings_json = "{}"}).value();
  NodeKey parent = no_key;
  for (int i = 0; i < 6; ++i) {
    const NodeKey key = store.add_node(run, parent, no_key, Candidate{.source = fmt::format("c={}", i), .origin = "test"},
                                       MemoryMode::fresh).value();
    Evaluation e{.failure = FailureKind::compile_error};
    e.diagnostics.message = "error: nothing compiles here";
    REQUIRE(store.add_evaluation(run, key, e));
    if (parent == no_key) parent = key;
  }
  REQUIRE(store.finish_run(run, "evaluation_budget", no_key, 0));

  const fs::path dir = case_directory("failed-run");
  const Rendered page = render(dir, report::render_html(store, run).value(), 2);
  INFO("screenshot: " << page.png.string());
  const Box& progress = page.layout.charts[0];
  const Box& tree = page.layout.charts[1];
  CHECK(count_near(page.image, progress, "#4477aa", tolerance) == 0);  // the checks above can fail
  CHECK(count_near(page.image, progress, "#cc3311", 60) >= 3 * 6);
  CHECK(count_green_nodes(page.image, tree) == 0);
  CHECK(count_near(page.image, tree, "#cc3311", tolerance) > 20 * 6);
  CHECK_THAT(page.layout.text, !Catch::Contains("verified"));
  CHECK_THAT(page.layout.text, Catch::Contains("no correct candidate: all 6 evaluations failed"));
}

TEST_CASE("a browser draws one curve per run in the comparison of a problem's runs", "[report][browser]") {
  if (!browser_available()) return;
  auto store = store::SqliteStore::open(":memory:").value();
  const SearchResult greedy = run_search(store, "greedy", 20, 1);
  const SearchResult random = run_search(store, "random", 20, 2);

  const fs::path dir = case_directory("comparison");
  const Rendered page = render(dir, report::render_comparison_html(store, "synthetic").value(), 1);
  INFO("screenshot: " << page.png.string());
  const Box& chart = page.layout.charts[0];
  // Each run's line spans the chart in its own colour; a third colour has no run to draw.
  CHECK(count_near(page.image, chart, report::detail::run_colours[0], tolerance) > 400);
  CHECK(count_near(page.image, chart, report::detail::run_colours[1], tolerance) > 400);
  CHECK(count_near(page.image, chart, report::detail::run_colours[2], tolerance) == 0);
  CHECK_THAT(page.layout.text, Catch::Contains(fmt::format("run {}, greedy: verified {:.2f}x", greedy.run_id, greedy.verified_speedup)));
  CHECK_THAT(page.layout.text, Catch::Contains(fmt::format("run {}, random: verified {:.2f}x", random.run_id, random.verified_speedup)));
}

}  // namespace kevo_tests::report_browser_test
