/* libnosys.so - stands in for libc's open and close in the microbenchmark's
 * "own cost" runs, so that what is timed is the shim's code alone, without
 * the kernel's open (whose run-to-run noise on a virtual machine is larger
 * than the shim's whole cost).
 *
 * Preloaded after libtiershim.so (LD_PRELOAD="libtiershim.so libnosys.so"),
 * it is what the shim's dlsym(RTLD_NEXT, "open") finds.  The first open of
 * the process is real, so that bench/micro.c can check through /proc/self/fd
 * where the shim sent it; every later open returns FAKE_FD without a system
 * call, and closing FAKE_FD does nothing.  Only bench/micro.c runs with it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FAKE_FD 900

static int opened_once;

/* micro.c opens read-only: there is never a mode argument to pass on */
static int fake_open(int dirfd, const char *path, int flags)
{
    if (!opened_once) {
        opened_once = 1;
        return (int)syscall(SYS_openat, dirfd, path, flags, 0);
    }
    return FAKE_FD;
}

int open(const char *path, int flags, ...) { return fake_open(AT_FDCWD, path, flags); }
int open64(const char *path, int flags, ...) { return fake_open(AT_FDCWD, path, flags); }
int openat(int dirfd, const char *path, int flags, ...) { return fake_open(dirfd, path, flags); }
int openat64(int dirfd, const char *path, int flags, ...) { return fake_open(dirfd, path, flags); }

int close(int fd)
{
    if (fd == FAKE_FD)
        return 0;
    return (int)syscall(SYS_close, fd);
}
