// LD_PRELOAD helper for crashes in native code on the GPU machine (no gdb there): on SIGSEGV,
// SIGBUS, SIGFPE or SIGABRT it prints the native backtrace (library + offset per frame) to stderr,
// then re-raises the signal so the exit status stays what it was.
//   gcc -shared -fPIC -O1 -o /tmp/segv_trace.so benchmarks/diag/segv_trace.c
//   LD_PRELOAD=/tmp/segv_trace.so python3 script.py
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fault(int sig) {
  void *frames[64];
  const char *msg = "\n== segv_trace: native backtrace ==\n";
  write(2, msg, strlen(msg));
  int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  void *warm[1];
  backtrace(warm, 1);  // loads libgcc_s now, not inside the handler
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_fault;
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
  sigaction(SIGFPE, &sa, 0);
  sigaction(SIGABRT, &sa, 0);
}
