//! checker.cpp's body, its last part, for CPU problems: the arena, the checks, the order of calls and
//! main(). It closes the namespace checker_process_head.cpp opened.
//! Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).
// An output element still holding this bit pattern was never written (a NaN no arithmetic makes).
constexpr std::uint32_t poison = 0x7fc0deadu;

// ---- memory ----

struct Arena {
  unsigned char* base = nullptr;
  std::size_t bytes = 0;
  std::size_t slot_bytes = 0;
} arena;

using Tensors = std::vector<std::vector<std::uint32_t>>;

long element_count(std::size_t i, const Shape& shape) {
  const long n = tensors[i].size(shape);
  if (n < 0) report_status("bad_report", std::string("negative size for tensor ") + tensors[i].name + " on shape " + shape_text(shape));
  return n;
}

// Tensor i starts on a 4 KiB boundary of its slot, then `shift` cache lines further.
constexpr int shifts = 7;
std::size_t span_bytes(std::size_t i, const Shape& shape) {
  const std::size_t bytes = static_cast<std::size_t>(element_count(i, shape) + guard_elements) * 4 + 64 * shifts;
  return (bytes + 4095) / 4096 * 4096;
}

std::vector<std::size_t> layout(const Shape& shape, int slot, int shift) {
  std::vector<std::size_t> offsets(tensor_count);
  std::size_t at = static_cast<std::size_t>(slot) * arena.slot_bytes;
  for (std::size_t i = 0; i < tensor_count; ++i) {
    offsets[i] = at + 64 * static_cast<std::size_t>(shift % shifts);
    at += span_bytes(i, shape);
  }
  return offsets;
}

void make_arena() {
  std::size_t slot = 4096;
  auto fit = [&](const Shape& shape) {
    std::size_t bytes = 0;
    for (std::size_t i = 0; i < tensor_count; ++i) bytes += span_bytes(i, shape);
    slot = std::max(slot, bytes);
  };
  for (const Shape& shape : check_shapes) fit(shape);
  fit(timing_shape);
  arena.slot_bytes = slot;
  arena.bytes = 2 * slot;
  // Sealed at its size: a runner that could shrink it would crash the checker (SIGBUS) on its next read.
  const int fd = ::memfd_create("kevo-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(arena.bytes)) != 0 || ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    report_status("sandbox_error", "cannot make the shared arena");
  void* base = ::mmap(nullptr, arena.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) report_status("sandbox_error", "cannot map the shared arena");
  arena.base = static_cast<unsigned char*>(base);
  send_descriptor(fd, arena.bytes);
  ::close(fd);
}

std::uint32_t draw_word(const TensorInfo& t, std::mt19937_64& rng) {
  std::normal_distribution<double> normal(0.0, t.scale);
  std::uniform_real_distribution<double> uniform(t.low, t.high);
  double v = t.uniform ? uniform(rng) : normal(rng);
  if (t.step > 0) v = std::round(v / t.step) * t.step;
  std::uint32_t word;
  if (t.is_float) {
    const float f = static_cast<float>(v);
    std::memcpy(&word, &f, 4);
  } else {
    const std::int32_t x = static_cast<std::int32_t>(std::floor(v));
    std::memcpy(&word, &x, 4);
  }
  return word;
}

// Fresh inputs (and `extra` more elements each, for windows), poisoned outputs.
Tensors draw(const Shape& shape, std::uint64_t seed, long extra = 0) {
  if constexpr (inputs_from_torch) {  // drawn as the module's get_inputs() draws them
    Tensors out = torch_draw(shape, seed, extra);
    for (std::size_t i = 0; i < tensor_count; ++i)
      if (tensors[i].output) out[i].assign(static_cast<std::size_t>(element_count(i, shape)), poison);
    return out;
  }
  Tensors out(tensor_count);
  for (std::size_t i = 0; i < tensor_count; ++i) {
    const TensorInfo& t = tensors[i];
    const long n = element_count(i, shape);
    if (t.output) {
      out[i].assign(static_cast<std::size_t>(n), poison);
      continue;
    }
    out[i].resize(static_cast<std::size_t>(n + extra));
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + i * 0xbf58476d1ce4e5b9ull + 1);
    for (auto& w : out[i]) w = draw_word(t, rng);
  }
  return out;
}

// The reference's outputs for `inputs`, in the checker's own memory.
Tensors reference_outputs(const Shape& shape, const Tensors& inputs, double* seconds = nullptr) {
  Tensors t = inputs;
  std::vector<void*> pointers(tensor_count);
  for (std::size_t i = 0; i < tensor_count; ++i) {
    t[i].resize(t[i].size() + guard_elements, poison);
    pointers[i] = t[i].data();
  }
  const double t0 = now();
  call_reference(shape, pointers.data());
  if (seconds) *seconds = now() - t0;
  for (std::size_t i = 0; i < tensor_count; ++i) t[i].resize(t[i].size() - guard_elements);
  // A reference that leaves an output element unwritten makes every candidate that writes it
  // "wrong": the problem is at fault, and says so before any candidate is blamed.
  for (std::size_t i = 0; i < tensor_count; ++i) {
    if (!tensors[i].output) continue;
    const auto left = std::count(t[i].begin(), t[i].end(), poison);
    if (left > 0)
      report_status("sandbox_error", "the reference left " + std::to_string(left) + " of " + std::to_string(t[i].size()) + " elements of " +
                                         tensors[i].name + " unwritten on shape " + shape_text(shape) +
                                         " (a reference must write every output element)");
  }
  return t;
}

#if !defined(__x86_64__)
// Writing and reading a buffer twice the last-level cache: where no instruction evicts a line
// (see evict_call_data), this is how a timed call is made to find its data in memory.
void flush_caches() {
  static std::vector<std::uint64_t> buffer = [] {
    std::size_t bytes = 64u << 20;
    std::ifstream size_file("/sys/devices/system/cpu/cpu0/cache/index3/size");
    std::string text;
    if (size_file >> text) {
      std::size_t kib = std::strtoull(text.c_str(), nullptr, 10);
      if (!text.empty() && (text.back() == 'M')) kib *= 1024;
      bytes = std::clamp<std::size_t>(2 * kib * 1024, 32u << 20, 512u << 20);
    }
    return std::vector<std::uint64_t>(bytes / 8);
  }();
  static std::uint64_t round = 0;
  ++round;
  for (auto& w : buffer) w += round;
  volatile std::uint64_t sink = 0;
  std::uint64_t sum = 0;
  for (auto w : buffer) sum += w;
  sink = sum;
  (void)sink;
}
#endif

#if defined(__x86_64__)
// clflushopt (most x86-64 CPUs since 2015) evicts lines without waiting for each, about 10x faster than clflush.
__attribute__((target("clflushopt"))) void evict_lines_unordered(unsigned char* first, std::size_t bytes) {
  for (std::size_t at = 0; at < bytes; at += 64) _mm_clflushopt(first + at);
}
void evict_lines_ordered(unsigned char* first, std::size_t bytes) {
  for (std::size_t at = 0; at < bytes; at += 64) _mm_clflush(first + at);
}
bool cpu_has_clflushopt() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b >> 23 & 1u);
}
#endif

// So that a timed call finds its data in memory, as it would in a real pipeline, and the roofline
// bounds it, the call's own bytes (inputs, outputs, guards) leave every cache level first. On
// x86-64 an eviction instruction does that (written back, dropped from every core's caches) at a
// cost that follows the call's data: writing a buffer twice the last-level cache instead cost about
// 0.2 s a call, 60% of an evaluation, on a 2-core machine whose CPU reports a 260 MB L3.
void evict_call_data(const Shape& shape, const std::vector<std::size_t>& offsets) {
#if defined(__x86_64__)
  static const bool unordered = cpu_has_clflushopt();
  for (std::size_t i = 0; i < tensor_count; ++i) {
    const std::size_t bytes = static_cast<std::size_t>(element_count(i, shape) + guard_elements) * 4;
    if (unordered) evict_lines_unordered(arena.base + offsets[i], bytes);
    else evict_lines_ordered(arena.base + offsets[i], bytes);
  }
  _mm_mfence();  // every eviction done before the clock starts
#else
  (void)shape, (void)offsets;
  flush_caches();
#endif
}

// ---- calls ----


// Places the inputs, poisons the outputs, has the runner call the kernel, and freezes it.
CallTiming call(const Shape& shape, const Tensors& inputs, const std::vector<std::size_t>& offsets, bool flush, const std::string& what) {
  for (std::size_t i = 0; i < tensor_count; ++i) {
    std::uint32_t* words = reinterpret_cast<std::uint32_t*>(arena.base + offsets[i]);
    const long n = element_count(i, shape);
    if (tensors[i].output) std::fill(words, words + n, poison);
    else std::memcpy(words, inputs[i].data(), static_cast<std::size_t>(n) * 4);
    std::fill(words + n, words + n + guard_elements, poison);
  }
  if (flush) evict_call_data(shape, offsets);
  return exchange(shape, {offsets}, what);
}

std::string value_text(const TensorInfo& t, std::uint32_t word) {
  char text[64];
  if (t.is_float) {
    float f;
    std::memcpy(&f, &word, 4);
    std::snprintf(text, sizeof text, "%.9g", static_cast<double>(f));
  } else {
    std::snprintf(text, sizeof text, "%d", static_cast<int>(static_cast<std::int32_t>(word)));
  }
  return text;
}

bool close_enough(const TensorInfo& t, std::uint32_t expected, std::uint32_t got) {
  if (!t.is_float) return expected == got;
  float e, g;
  std::memcpy(&e, &expected, 4);
  std::memcpy(&g, &got, 4);
  if ((std::isnan(e) && std::isnan(g)) || e == g) return true;
  return std::fabs(static_cast<double>(e) - static_cast<double>(g)) <= tolerance_abs + tolerance_rel * std::fabs(static_cast<double>(e));
}

// Checks the frozen arena: every output element written and right, nothing past the ends, every
// input as it was. `previous` (the outputs of an earlier call) names a replay.
void verify(const Shape& shape, const Tensors& expected, const Tensors& inputs, const std::vector<std::size_t>& offsets,
            const std::string& what, const Tensors* previous = nullptr) {
  for (std::size_t i = 0; i < tensor_count; ++i) {
    const TensorInfo& t = tensors[i];
    const std::uint32_t* got = reinterpret_cast<const std::uint32_t*>(arena.base + offsets[i]);
    const long n = element_count(i, shape);
    for (long k = n; k < n + guard_elements; ++k)
      if (got[k] != poison)
        report_status(t.output ? "wrong_answer" : "mutated_input", std::string(t.name) + ": wrote past its end (element " + std::to_string(k) +
                                                     " of " + std::to_string(n) + ") " + what);
    if (!t.output) {
      for (long k = 0; k < n; ++k)
        if (got[k] != inputs[i][static_cast<std::size_t>(k)])
          report_status("mutated_input", std::string("changed its input ") + t.name + " (element " + std::to_string(k) + " was " +
                                             value_text(t, inputs[i][static_cast<std::size_t>(k)]) + ", is " + value_text(t, got[k]) + ") " + what);
      continue;
    }
    long unwritten = 0, first_unwritten = -1, wrong = 0, first_wrong = -1, replayed = 0;
    for (long k = 0; k < n; ++k) {
      const std::uint32_t e = expected[i][static_cast<std::size_t>(k)];
      if (got[k] == poison && e != poison) {
        if (unwritten++ == 0) first_unwritten = k;
        continue;
      }
      if (close_enough(t, e, got[k])) continue;
      if (wrong++ == 0) first_wrong = k;
      if (previous && close_enough(t, (*previous)[i][static_cast<std::size_t>(k)], got[k])) ++replayed;
    }
    if (unwritten > 0)
      report_status("unwritten_output", std::string(t.name) + ": " + std::to_string(unwritten) + " of " + std::to_string(n) +
                                            " elements left unwritten (first at index " + std::to_string(first_unwritten) + ") " + what);
    if (wrong > 0 && replayed == wrong)
      report_status("replayed_output", std::string(t.name) + ": " + std::to_string(wrong) + " of " + std::to_string(n) +
                                           " elements are an earlier call's outputs, for inputs that differ from that call's " + what);
    if (wrong > 0)
      report_status("wrong_answer", std::string(t.name) + ": " + std::to_string(wrong) + " of " + std::to_string(n) +
                                        " elements differ beyond tolerance (first at index " + std::to_string(first_wrong) + ": expected " +
                                        value_text(t, expected[i][static_cast<std::size_t>(first_wrong)]) + ", got " +
                                        value_text(t, got[first_wrong]) + ") " + what);
  }
}

// One checked call: place, run, freeze, verify. The runner stays stopped until the next call's
// clock starts, so nothing it does while the checker places inputs or flushes caches goes untimed.
CallTiming checked_call(const Shape& shape, const Tensors& inputs, const Tensors& expected, int slot, int shift, bool flush,
                        const std::string& what, const Tensors* previous = nullptr) {
  const std::vector<std::size_t> offsets = layout(shape, slot, shift);
  const CallTiming timing = call(shape, inputs, offsets, flush, what);
  verify(shape, expected, inputs, offsets, what, previous);
  return timing;
}


// A tolerance under which one constant matches every output element of every check shape makes
// the check meaningless: a kernel could write that constant. Tried: 0, the median, the midpoint.
void validate_tolerance() {
  for (std::size_t i = 0; i < tensor_count; ++i) {
    if (!tensors[i].output) continue;
    std::vector<std::vector<std::uint32_t>> outputs;
    std::vector<double> values;
    std::uint64_t seed = options.seed;
    for (const Shape& shape : check_shapes) {
      outputs.push_back(reference_outputs(shape, draw(shape, seed++))[i]);
      for (std::uint32_t w : outputs.back()) {
        float f;
        std::memcpy(&f, &w, 4);
        values.push_back(tensors[i].is_float ? static_cast<double>(f) : static_cast<double>(static_cast<std::int32_t>(w)));
      }
    }
    if (values.empty()) continue;
    std::sort(values.begin(), values.end());
    for (double c : {0.0, values[values.size() / 2], 0.5 * (values.front() + values.back())}) {
      std::uint32_t word;
      if (tensors[i].is_float) {
        const float f = static_cast<float>(c);
        std::memcpy(&word, &f, 4);
      } else {
        const std::int32_t x = static_cast<std::int32_t>(c);
        std::memcpy(&word, &x, 4);
      }
      bool all_pass = true;
      for (const auto& out : outputs)
        for (std::uint32_t e : out) all_pass = all_pass && close_enough(tensors[i], e, word);
      if (all_pass)
        report_status("loose_tolerance", std::string("a kernel that writes the constant ") + value_text(tensors[i], word) + " to " +
                                             tensors[i].name + " passes every check shape under this tolerance");
    }
  }
  report("{\"status\":\"ok\"}");
}

}  // namespace

int main(int argc, char** argv) {
  parse_options(argc, argv);
  try {
    if (options.validate_tolerance) validate_tolerance();
    meet_runner();
    make_arena();
    expect_greeting();

    std::uint64_t seed = options.seed;
    int calls = 0;
    for (const Shape& shape : check_shapes) {
      const Tensors inputs = draw(shape, seed++);
      const Tensors expected = reference_outputs(shape, inputs);
      checked_call(shape, inputs, expected, calls % 2, calls % shifts, false, "on shape " + shape_text(shape));
      ++calls;
    }

    // The timing shape: a pool of inputs, `window` elements longer than each tensor; call k reads
    // the window at its own offset, so no two calls see the same inputs.
    constexpr long window = 4099;
    const Tensors pool = draw(timing_shape, seed++, window);
    std::mt19937_64 offsets(options.seed ^ 0x5bd1e995u);
    auto window_inputs = [&](long at) {
      Tensors inputs(tensor_count);
      for (std::size_t i = 0; i < tensor_count; ++i) {
        const long n = element_count(i, timing_shape);
        if (tensors[i].output) inputs[i].assign(static_cast<std::size_t>(n), poison);
        else inputs[i].assign(pool[i].begin() + at, pool[i].begin() + at + n);
      }
      return inputs;
    };
    const std::string on_timing = "on the timing shape " + shape_text(timing_shape);
    double reference_seconds = 0;
    Tensors inputs = window_inputs(0);
    Tensors expected = reference_outputs(timing_shape, inputs, &reference_seconds);
    checked_call(timing_shape, inputs, expected, calls % 2, calls % shifts, false, on_timing);
    ++calls;

    const int cpus = runner_cpus();
    std::vector<double> samples, walls, cpu_times;
    const int total = options.warmup + options.repetitions;
    Tensors earlier;  // the first call of the pair's outputs: what a replay by pointer returns
    for (int k = 0; k < total; ++k) {
      inputs = window_inputs(static_cast<long>(offsets() % window));
      if (k % 2 == 1) earlier = std::move(expected);
      expected = reference_outputs(timing_shape, inputs);
      // Calls 2j and 2j + 1 share their addresses, with new inputs: a kernel keyed on pointers
      // replays there. Each pair moves.
      const CallTiming t = checked_call(timing_shape, inputs, expected, (k / 2) % 2, (k / 4) % shifts, options.flush,
                                        on_timing + " (timed call " + std::to_string(k + 1) + ")", k % 2 == 1 ? &earlier : nullptr);
      ++calls;
      const double seconds = std::max(t.wall, t.cpu / cpus);
      // Far slower than the reference: one sample says enough, and saves the search the rest. (Not
      // below 10 ms, where a call's round trip, about 25 us, would count against a tiny kernel.)
      const bool hopeless = k == 0 && seconds > 0.01 && seconds > 10 * reference_seconds;
      if (k >= options.warmup || hopeless) {
        samples.push_back(seconds);
        walls.push_back(t.wall);
        cpu_times.push_back(t.cpu);
      }
      if (hopeless) break;
    }

    // The last timed inputs with one element in 256 of each input changed, at the other slot.
    Tensors changed = inputs;
    std::mt19937_64 pick(options.seed * 31 + 7);
    for (std::size_t i = 0; i < tensor_count; ++i) {
      if (tensors[i].output || changed[i].empty()) continue;
      const std::size_t n = changed[i].size();
      for (std::size_t c = 0; c < std::max<std::size_t>(1, n / 256); ++c) changed[i][pick() % n] = pool[i][pick() % pool[i].size()];
    }
    const Tensors changed_expected = reference_outputs(timing_shape, changed);
    checked_call(timing_shape, changed, changed_expected, (calls + 1) % 2, 3, false,
                 on_timing + " (inputs of the last timed call with 1 element in 256 changed)", &expected);

    send_quit();
    char line[512];
    std::snprintf(line, sizeof line,
                  "{\"status\":\"ok\",\"seconds\":%.9g,\"min_seconds\":%.9g,\"samples\":%d,\"bytes\":%.17g,\"flops\":%.17g,"
                  "\"wall_seconds\":%.9g,\"cpu_seconds\":%.9g,\"cpus\":%d}",
                  median(samples), *std::min_element(samples.begin(), samples.end()), static_cast<int>(samples.size()),
                  bytes_model(timing_shape), flops_model(timing_shape), median(walls), median(cpu_times), cpus);
    report(line);
  } catch (const std::bad_alloc&) {
    report_status("sandbox_error", "the checker ran out of memory");
  } catch (const std::exception& e) {
    report_status("sandbox_error", std::string("the checker failed: ") + e.what());
  }
}
