//! runner.cpp's @helpers@ for CPU problems: the arena is shared memory, mapped here.
//! Lines that start with //! are not embedded (cmake/EmbedHarnessSources.cmake).

unsigned char* map_arena(int control, int fd, std::uint64_t bytes) {
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped != MAP_FAILED) return static_cast<unsigned char*>(mapped);
  // No std::string: where the candidate has taken the address space, nothing may be allocated.
  char text[200];
  std::snprintf(text, sizeof text, "kevo's runner could not map the checker's arena: %s", std::strerror(errno));
  send_reply(control, reply_failed, 0, text);
  return nullptr;
}

void empty_command() {}
std::string finish_calls() { return {}; }
