// kevo/detail/member_named.hpp: whether a class declares a member of a given name, whatever its kind
// or signature (a function, overloaded or a template, a static or data member). The concepts' optional
// hooks use it so that a member named like a hook but shaped otherwise is an error naming the hook,
// not a hook the loop silently never calls. The way: a class deriving from T and from a class with
// that member cannot name it where T has one too (the lookup is ambiguous), and names it otherwise.
// A final class cannot be derived from: there, only a member that is not overloaded is seen.
#pragma once

#include <type_traits>

/// Defines `kevo::detail::has_member_named_<name><T>`; use at namespace scope, once per name.
#define KEVO_DETAIL_MEMBER_NAMED(name)                                                                   \
  namespace kevo::detail {                                                                               \
  namespace member_named_##name {                                                                        \
  struct Fallback {                                                                                      \
    int name;                                                                                            \
  };                                                                                                     \
  template <class T>                                                                                     \
  struct Both : T, Fallback {};                                                                          \
  }                                                                                                      \
  template <class T>                                                                                     \
  concept has_member_named_##name =                                                                      \
      std::is_class_v<T> && ((!std::is_final_v<T> && !requires { &member_named_##name::Both<T>::name; }) || \
                             requires { &T::name; });                                                   \
  }
