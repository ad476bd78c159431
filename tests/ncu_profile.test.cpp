// Nsight Compute feedback: the ncu command line, the parser of ncu --csv output (a real capture from
// the H200 and hand-written ones), and the bottleneck class built on the metrics.
#include <kevo/eval/ncu_profile.hpp>

#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kevo_tests::ncu_profile_test {

namespace {

const std::filesystem::path fixtures = std::filesystem::path(KEVO_TEST_DATA_DIR) / "ncu";

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::string header =
    R"csv("ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value")csv";

/// One CSV row shaped like the real capture's (tests/data/ncu/probe.csv).
std::string row(const std::string& id, const std::string& kernel, const std::string& metric, const std::string& unit,
                const std::string& value) {
  return "\"" + id + R"csv(","1925","ncu_probe","127.0.0.1",")csv" + kernel +
         R"csv(","1","7","(256, 1, 1)","(1056, 1, 1)","0","9.0","Command line profiler metrics",")csv" + metric + "\",\"" + unit +
         "\",\"" + value + "\"\n";
}

std::string stall(const std::string& reason) {
  return std::string(kevo::eval::ncu_stall_prefix) + reason + std::string(kevo::eval::ncu_stall_suffix);
}

// Hand-written, not captured: a launch with every metric kevo asks for, shaped like the real output
// (same columns, quoting, units and thousands separators). The values pick the class.
struct Launch {
  std::string id = "0";
  std::string kernel = "k(float *, int)";
  std::string duration = "10,000";
  std::string duration_unit = "ns";
  std::string dram, sm, achieved, theoretical;
  std::vector<std::pair<std::string, std::string>> stalls;
};

std::string render(const Launch& l) {
  std::string text;
  text += row(l.id, l.kernel, "gpu__time_duration.sum", l.duration_unit, l.duration);
  if (!l.dram.empty()) text += row(l.id, l.kernel, "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", l.dram);
  if (!l.sm.empty()) text += row(l.id, l.kernel, "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", l.sm);
  if (!l.achieved.empty()) text += row(l.id, l.kernel, "sm__warps_active.avg.pct_of_peak_sustained_active", "%", l.achieved);
  if (!l.theoretical.empty()) text += row(l.id, l.kernel, "sm__maximum_warps_per_active_cycle_pct", "%", l.theoretical);
  for (const auto& [reason, value] : l.stalls) text += row(l.id, l.kernel, stall(reason), "", value);
  return text;
}

std::string csv(const std::vector<Launch>& launches) {
  std::string text = "==PROF== Connected to process 1925 (/tmp/candidate)\n" + header + "\n";
  for (const Launch& l : launches) text += render(l);
  return text;
}

kevo::eval::KernelProfile parse_one(const Launch& l) {
  auto profiles = kevo::eval::parse_ncu_csv(csv({l}));
  INFO((profiles ? std::string() : profiles.error().message));
  REQUIRE(profiles);
  REQUIRE(profiles->size() == 1);
  return profiles->front();
}

}  // namespace

TEST_CASE("the ncu command asks for every metric with the clocks left alone") {
  auto argv = kevo::eval::ncu_command("/tmp/candidate", {"--shape", "4096"},
                                      {.ncu = "/usr/local/cuda/bin/ncu", .kernel_name_regex = "scale.*", .launch_count = 3});
  const std::vector<std::string> head = {"/usr/local/cuda/bin/ncu", "--clock-control", "none", "--csv", "--metrics"};
  REQUIRE(argv.size() == head.size() + 1 + 4 + 3);
  CHECK(std::equal(head.begin(), head.end(), argv.begin()));
  const std::string& metrics = argv[head.size()];
  for (std::string_view m : kevo::eval::ncu_metrics) CHECK(contains(metrics, std::string(m)));
  CHECK(contains(metrics, "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"));
  CHECK(contains(metrics, "sm__maximum_warps_per_active_cycle_pct"));
  CHECK_FALSE(contains(metrics, " "));
  CHECK(std::vector<std::string>(argv.begin() + 6, argv.end()) ==
        std::vector<std::string>{"--kernel-name", "regex:scale.*", "--launch-count", "3", "/tmp/candidate", "--shape", "4096"});

  auto plain = kevo::eval::ncu_command("/tmp/candidate");
  CHECK(plain.front() == "ncu");
  CHECK(plain.back() == "/tmp/candidate");
  CHECK(plain.size() == 7);
}

TEST_CASE("the real H200 capture parses into two memory-bound launches") {
  auto profiles = kevo::eval::parse_ncu_csv(read_text(fixtures / "probe.csv"));
  INFO((profiles ? std::string() : profiles.error().message));
  REQUIRE(profiles);
  REQUIRE(profiles->size() == 2);
  const auto& first = (*profiles)[0];
  const auto& second = (*profiles)[1];
  CHECK(first.id == "0");
  CHECK(second.id == "1");
  CHECK(first.kernel_name == "scale(const float *, float *, long)");
  CHECK(second.kernel_name == "scale(const float *, float *, long)");
  CHECK(first.seconds == Approx(172.192e-6).epsilon(1e-9));
  CHECK(second.seconds == Approx(172.864e-6).epsilon(1e-9));
  REQUIRE(first.dram_percent);
  REQUIRE(first.sm_percent);
  CHECK(*first.dram_percent == Approx(62.42));
  CHECK(*first.sm_percent == Approx(11.45));
  CHECK(*second.dram_percent == Approx(62.15));
  CHECK(*second.sm_percent == Approx(11.42));
  CHECK_FALSE(first.achieved_occupancy_percent);
  CHECK(first.stalls.empty());

  CHECK(kevo::eval::classify(first) == kevo::Bottleneck::memory);
  CHECK(kevo::eval::classify(second) == kevo::Bottleneck::memory);
  CHECK(kevo::eval::describe(first) == "memory-bound: DRAM 62% of peak, SM 11%");

  const auto total = kevo::eval::aggregate(*profiles);
  CHECK(total.launches == 2);
  CHECK(total.seconds == Approx(345.056e-6));
  CHECK(*total.dram_percent == Approx((62.42 * 172.192 + 62.15 * 172.864) / 345.056));
  CHECK(total.kernel_name == "scale(const float *, float *, long)");
  CHECK(kevo::eval::classify(total) == kevo::Bottleneck::memory);
  CHECK(contains(kevo::eval::describe(total), "(2 launches)"));
}

TEST_CASE("stall reasons are shares of the cycles between issues, heaviest first, without 'selected'") {
  Launch l{.dram = "30.4", .sm = "20.25", .achieved = "85.1", .theoretical = "100",
           .stalls = {{"wait", "1"}, {"long_scoreboard", "6"}, {"selected", "1"}, {"lg_throttle", "2"}}};
  auto p = parse_one(l);
  REQUIRE(p.stalls.size() == 3);
  CHECK(p.stalls[0].name == "long_scoreboard");
  CHECK(p.stalls[0].cycles_per_issue == Approx(6));
  CHECK(p.stalls[0].percent == Approx(60));
  CHECK(p.stalls[1].name == "lg_throttle");
  CHECK(p.stalls[1].percent == Approx(20));
  CHECK(p.stalls[2].name == "wait");
  CHECK(*p.achieved_occupancy_percent == Approx(85.1));
  CHECK(*p.theoretical_occupancy_percent == Approx(100));
  // DRAM and SM under 60% with the warps there: latency-bound, and the stalls say on what.
  CHECK(kevo::eval::classify(p) == kevo::Bottleneck::latency);
  CHECK(kevo::eval::describe(p) ==
        "latency-bound: DRAM 30% of peak, SM 20%, occupancy 85% of 100% theoretical; top stalls long_scoreboard 60%, "
        "lg_throttle 20%, wait 10%");
}

TEST_CASE("the classification rules in order") {
  using kevo::Bottleneck;
  auto cls = [](Launch l) { return kevo::eval::classify(parse_one(l)); };
  // Memory: DRAM at 60% or more and at least the SM's share.
  CHECK(cls({.dram = "88", .sm = "21", .achieved = "90", .theoretical = "100"}) == Bottleneck::memory);
  CHECK(cls({.dram = "70", .sm = "70"}) == Bottleneck::memory);
  // Compute: the SM at 60% or more (and busier than DRAM when both are).
  CHECK(cls({.dram = "75", .sm = "92", .achieved = "40", .theoretical = "50"}) == Bottleneck::compute);
  CHECK(cls({.dram = "12", .sm = "60", .stalls = {{"math_pipe_throttle", "3"}, {"selected", "1"}}}) == Bottleneck::compute);
  // Occupancy: achieved under half the theoretical, or the theoretical itself under 25%.
  CHECK(cls({.dram = "20", .sm = "15", .achieved = "20", .theoretical = "100"}) == Bottleneck::occupancy);
  CHECK(cls({.dram = "20", .sm = "15", .achieved = "18", .theoretical = "18.75"}) == Bottleneck::occupancy);
  // Latency: neither unit busy, warps present.
  CHECK(cls({.dram = "20", .sm = "15", .achieved = "60", .theoretical = "100"}) == Bottleneck::latency);
  CHECK(cls({.dram = "59.9", .sm = "59.9"}) == Bottleneck::latency);
  // Nothing to judge by.
  CHECK(cls({}) == Bottleneck::unknown);

  auto occupancy = parse_one({.dram = "20", .sm = "15", .achieved = "20", .theoretical = "100", .stalls = {{"barrier", "2"}}});
  CHECK(contains(kevo::eval::describe(occupancy), "occupancy-limited: DRAM 20% of peak, SM 15%, occupancy 20% of 100% theoretical"));
}

TEST_CASE("several launches are weighed by their durations") {
  // A long memory-bound kernel and a short compute-bound one: the candidate is memory-bound.
  Launch big{.id = "0", .kernel = "stream(float *)", .duration = "900", .duration_unit = "us", .dram = "90", .sm = "20",
             .achieved = "90", .theoretical = "100", .stalls = {{"long_scoreboard", "8"}, {"selected", "1"}}};
  Launch small{.id = "1", .kernel = "gemm(float *)", .duration = "100", .duration_unit = "us", .dram = "10", .sm = "95",
               .achieved = "40", .theoretical = "50", .stalls = {{"math_pipe_throttle", "3"}, {"selected", "1"}}};
  auto profiles = kevo::eval::parse_ncu_csv(csv({big, small}));
  REQUIRE(profiles);
  REQUIRE(profiles->size() == 2);
  CHECK(kevo::eval::classify((*profiles)[1]) == kevo::Bottleneck::compute);
  const auto total = kevo::eval::aggregate(*profiles);
  CHECK(total.seconds == Approx(1e-3));
  CHECK(*total.dram_percent == Approx(0.9 * 90 + 0.1 * 10));
  CHECK(*total.sm_percent == Approx(0.9 * 20 + 0.1 * 95));
  CHECK(*total.achieved_occupancy_percent == Approx(0.9 * 90 + 0.1 * 40));
  CHECK(total.kernel_name == "stream(float *); gemm(float *)");
  REQUIRE(total.stalls.size() == 2);
  CHECK(total.stalls[0].name == "long_scoreboard");
  CHECK(total.stalls[0].percent == Approx(0.9 * 100 * 8 / 9));
  CHECK(total.stalls[1].name == "math_pipe_throttle");
  CHECK(total.stalls[1].percent == Approx(0.1 * 75));
  CHECK(kevo::eval::classify(total) == kevo::Bottleneck::memory);

  // The profile replaces the roofline's class and line; without one, the roofline stands.
  kevo::Diagnostics roofline{.bottleneck = kevo::Bottleneck::latency, .achieved_gbytes_per_s = 1234, .message = "roofline"};
  auto d = kevo::eval::prefer_profile(roofline, *profiles);
  CHECK(d.bottleneck == kevo::Bottleneck::memory);
  CHECK(d.achieved_gbytes_per_s == 1234);
  CHECK(d.message.starts_with("memory-bound: DRAM 82% of peak"));
  CHECK(contains(d.message, "top stalls long_scoreboard"));
  auto without = kevo::eval::prefer_profile(roofline, {});
  CHECK(without.bottleneck == kevo::Bottleneck::latency);
  CHECK(without.message == "roofline");
  auto unknown = kevo::eval::prefer_profile(roofline, *kevo::eval::parse_ncu_csv(csv({Launch{}})));
  CHECK(unknown.message == "roofline");
}

TEST_CASE("durations convert from every unit ncu prints") {
  for (auto [unit, value, seconds] : {std::tuple{"ns", "1,500", 1.5e-6},
                                      {"nsecond", "2,000", 2e-6},
                                      {"us", "172.19", 172.19e-6},
                                      {"usecond", "3.5", 3.5e-6},
                                      {"ms", "1.25", 1.25e-3},
                                      {"msecond", "2", 2e-3},
                                      {"s", "1", 1.0},
                                      {"second", "0.5", 0.5}}) {
    INFO(unit);
    auto p = parse_one({.duration = value, .duration_unit = unit, .dram = "1", .sm = "1"});
    CHECK(p.seconds == Approx(seconds).epsilon(1e-12));
  }
  auto bad = kevo::eval::parse_ncu_csv(csv({Launch{.duration_unit = "cycle"}}));
  REQUIRE_FALSE(bad);
  CHECK(contains(bad.error().message, "line 3"));
  CHECK(contains(bad.error().message, "cycle"));
}

TEST_CASE("malformed ncu output is an error that names the line") {
  const std::string good = csv({Launch{.dram = "50", .sm = "20"}});  // header on line 2, rows on 3..5
  SECTION("a row with too few fields") {
    auto r = kevo::eval::parse_ncu_csv(good + R"csv("1","1925","ncu_probe","127.0.0.1","k(float *, int)","1")csv" + "\n");
    REQUIRE_FALSE(r);
    CHECK(contains(r.error().message, "line 6"));
    CHECK(contains(r.error().message, "6 fields where the header has 15"));
  }
  SECTION("a value that is no number") {
    auto r = kevo::eval::parse_ncu_csv(good + row("1", "k(float *, int)", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "%", "fast"));
    REQUIRE_FALSE(r);
    CHECK(contains(r.error().message, "line 6"));
    CHECK(contains(r.error().message, "\"fast\" is not a number"));
  }
  SECTION("an unterminated quote") {
    auto r = kevo::eval::parse_ncu_csv(good + R"csv("1","1925","ncu_probe)csv" + "\n");
    REQUIRE_FALSE(r);
    CHECK(contains(r.error().message, "line 6"));
    CHECK(contains(r.error().message, "unterminated"));
  }
  SECTION("no CSV at all: ncu's complaint is passed on") {
    auto r = kevo::eval::parse_ncu_csv("==PROF== Connected to process 7\n==WARNING== No kernels were profiled.\n");
    REQUIRE_FALSE(r);
    CHECK(contains(r.error().message, "No kernels were profiled"));
  }
  SECTION("n/a is a metric this GPU lacks, not an error") {
    auto r = kevo::eval::parse_ncu_csv(good + row("0", "k(float *, int)", "sm__maximum_warps_per_active_cycle_pct", "%", "n/a"));
    REQUIRE(r);
    CHECK_FALSE(r->front().theoretical_occupancy_percent);
  }
}

TEST_CASE("the CSV splitter follows RFC 4180 quoting") {
  auto fields = kevo::eval::detail::split_csv_record(R"csv("a, b","say ""hi""",plain,,"")csv");
  REQUIRE(fields);
  CHECK(*fields == std::vector<std::string>{"a, b", "say \"hi\"", "plain", "", ""});
  CHECK_FALSE(kevo::eval::detail::split_csv_record(R"csv("a"b)csv"));
  CHECK_FALSE(kevo::eval::detail::split_csv_record(R"csv(a"b)csv"));
  auto crlf = kevo::eval::parse_ncu_csv("==PROF== x\r\n" + header + "\r\n" +
                                        row("0", "k()", "dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "1,061.5"));
  REQUIRE(crlf);
  CHECK(*crlf->front().dram_percent == Approx(1061.5));
}

TEST_CASE("a profiled candidate's jail binds ncu's own directory, never a top-level one or one that holds private files") {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("kevo-ncu-tree-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "nsight-compute" / "2025.1");
  fs::create_directories(root / "home");
  auto touch = [](const fs::path& p) { std::ofstream(p) << "#!/bin/sh\n"; };
  touch(root / "nsight-compute" / "2025.1" / "ncu");
  touch(root / "ncu");
  const std::vector<fs::path> private_places{root / "home", root / "cache"};

  auto own = kevo::eval::ncu_install_tree(root / "nsight-compute" / "2025.1" / "ncu", private_places);
  REQUIRE(own);
  REQUIRE(own->has_value());
  CHECK(**own == fs::canonical(root / "nsight-compute" / "2025.1"));
  // A link is followed to where ncu really is.
  fs::create_directory_symlink(root / "nsight-compute" / "2025.1", root / "home" / "ncu-link");
  auto linked = kevo::eval::ncu_install_tree(root / "home" / "ncu-link" / "ncu", private_places);
  REQUIRE(linked);
  CHECK(**linked == **own);

  auto holds_home = kevo::eval::ncu_install_tree(root / "ncu", private_places);
  REQUIRE_FALSE(holds_home);
  CHECK(contains(holds_home.error().message, "holds " + (root / "home").string()));
  CHECK(contains(holds_home.error().message, "is not bound into a candidate's jail"));

  // A file in a top-level directory (KEVO_NCU=/etc/passwd, or /ncu): its directory would show the jail
  // every user's files, or the whole machine.
  auto near_root = kevo::eval::ncu_install_tree("/etc/passwd", {});
  REQUIRE_FALSE(near_root);
  CHECK(contains(near_root.error().message, "its directory /etc is not an install tree of its own"));

  auto system = kevo::eval::ncu_install_tree("/usr/bin/env", private_places);
  REQUIRE(system);
  CHECK_FALSE(system->has_value());  // under /usr, which every jail has already
  auto missing = kevo::eval::ncu_install_tree(root / "no-such-ncu", private_places);
  REQUIRE_FALSE(missing);
  CHECK(contains(missing.error().message, "no-such-ncu"));
  fs::remove_all(root);
}

}  // namespace kevo_tests::ncu_profile_test
