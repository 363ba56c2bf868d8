// Keeps the extension loadable on glibc 2.28, the oldest glibc the Hub's kernel checks accept
// (manylinux_2_28, which torch's own wheels also target), when it is built on a newer one: the
// variant built on the GPU machine (Ubuntu 24.04, glibc 2.39) needed GLIBC_2.32 and GLIBC_2.38
// symbols until this file (fused_geglu_tools/abi.py checks every build).
//
// Compiled against glibc >= 2.32, libstdc++'s inline reference counting (std::shared_ptr,
// std::locale inside every ostringstream, so every TORCH_CHECK message) reads glibc's
// `__libc_single_threaded` (GLIBC_2.32) to skip atomics in single-threaded processes. Each
// translation unit of the extension then needs that symbol, and the dynamic loader of an older glibc
// refuses the whole library. Defined here with hidden visibility, the references bind to this copy
// at link time and no GLIBC_2.32 reference is left. It stays 0 ("other threads may exist"), so the
// inline code always takes the atomic path: always correct, and what glibc < 2.32 did anyway. Built
// against older glibc headers nothing references it and it is an unused local symbol.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}

// Compiled against glibc >= 2.38 in C++ (g++ defines _GNU_SOURCE, which turns on C23's rules), the
// headers redirect strtol and its kin to `__isoc23_strtol` ... (GLIBC_2.38), which also accept a "0b"
// prefix; inline library code (std::stoi, c10's environment parsing) then references them. These
// hidden definitions forward to the entries every glibc has. This file includes no header, so the
// declarations below are not redirected; a binary prefix is then not parsed, which nothing here uses.
extern "C" {
long strtol(const char*, char**, int);
unsigned long strtoul(const char*, char**, int);
long long strtoll(const char*, char**, int);
unsigned long long strtoull(const char*, char**, int);

__attribute__((visibility("hidden"))) long __isoc23_strtol(const char* s, char** end, int base) {
  return strtol(s, end, base);
}
__attribute__((visibility("hidden"))) unsigned long __isoc23_strtoul(const char* s, char** end, int base) {
  return strtoul(s, end, base);
}
__attribute__((visibility("hidden"))) long long __isoc23_strtoll(const char* s, char** end, int base) {
  return strtoll(s, end, base);
}
__attribute__((visibility("hidden"))) unsigned long long __isoc23_strtoull(const char* s, char** end, int base) {
  return strtoull(s, end, base);
}
}
