//! runner.cpp's @helpers@ for CPU problems: the arena is shared memory, mapped here.
//! Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).

unsigned char* map_arena(int, int fd, std::uint64_t bytes) {
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return mapped == MAP_FAILED ? nullptr : static_cast<unsigned char*>(mapped);
}

void empty_command() {}
std::string finish_calls() { return {}; }
