// Keeps the extension loadable on glibc 2.28, the oldest glibc the Hub's kernel checks accept
// (manylinux_2_28, which torch's own wheels also target).
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
