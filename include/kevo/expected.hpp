// kevo/expected.hpp: a small std::expected stand-in (C++20 has none), for host calls that can fail.
//
//   kevo::expected<Problem, Error> p = load_problem(dir);
//   if (!p) fmt::print("{}\n", p.error().message);
//   use(*p);
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace kevo {

template <class E>
class unexpected {
 public:
  explicit unexpected(E error) : error_(std::move(error)) {}
  E& error() & { return error_; }
  const E& error() const& { return error_; }
  E&& error() && { return std::move(error_); }

 private:
  E error_;
};
template <class E>
unexpected(E) -> unexpected<E>;

/// Thrown by expected::value() when it holds an error: reading a value that is not there is a bug.
class bad_expected_access : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

template <class T, class E>
class expected {
 public:
  using value_type = T;
  using error_type = E;

  template <class U = T>
    requires std::is_constructible_v<T, U&&> && (!std::is_same_v<std::remove_cvref_t<U>, expected>)
  expected(U&& value) : storage_(std::in_place_index<0>, std::forward<U>(value)) {}
  template <class G>
  expected(unexpected<G> error) : storage_(std::in_place_index<1>, std::move(error).error()) {}
  expected()
    requires std::is_default_constructible_v<T>
      : storage_(std::in_place_index<0>) {}

  bool has_value() const noexcept { return storage_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & { check(); return std::get<0>(storage_); }
  const T& value() const& { check(); return std::get<0>(storage_); }
  T&& value() && { check(); return std::get<0>(std::move(storage_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  E& error() & { return std::get<1>(storage_); }
  const E& error() const& { return std::get<1>(storage_); }

 private:
  void check() const {
    if (!has_value()) throw bad_expected_access("kevo::expected: value() called on an error");
  }
  std::variant<T, E> storage_;
};

/// expected<void, E>: success carries nothing.
template <class E>
class expected<void, E> {
 public:
  expected() = default;
  template <class G>
  expected(unexpected<G> error) : error_(std::move(error).error()), ok_(false) {}
  bool has_value() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  void value() const {
    if (!ok_) throw bad_expected_access("kevo::expected: value() called on an error");
  }
  const E& error() const& { return error_; }

 private:
  E error_{};
  bool ok_ = true;
};

/// Whose the fault is, so that a caller can react without reading the message (a server answers
/// 400 for the caller's fault, 503 for capacity, 500 for the rest).
enum class ErrorKind : unsigned char {
  caller,    ///< bad input: the request, a file, an argument (validated at the layer that takes it in)
  capacity,  ///< a full index or arena, memory that ran out: retrying later or larger may succeed
  backend,   ///< the device, the database, the network or the compiler failed
  bug,       ///< an invariant of kevo's own broke
};

inline const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::caller: return "caller";
    case ErrorKind::capacity: return "capacity";
    case ErrorKind::backend: return "backend";
    case ErrorKind::bug: return "bug";
  }
  return "?";
}

/// The error type that most kevo calls return: a message a person can act on, and its kind.
struct Error {
  std::string message;
  ErrorKind kind = ErrorKind::caller;
};

inline unexpected<Error> make_error(std::string message, ErrorKind kind = ErrorKind::caller) {
  return unexpected<Error>(Error{std::move(message), kind});
}

}  // namespace kevo
