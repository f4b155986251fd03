// Invariant checks that stay on in release builds. Never use these on
// external data (files, network, user input): that gets a Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

#define DL_CHECK(cond, ...)                                               \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, \
                   #cond);                                                \
      std::fprintf(stderr, __VA_ARGS__);                                  \
      std::fputc('\n', stderr);                                           \
      std::abort();                                                       \
    }                                                                     \
  } while (0)
