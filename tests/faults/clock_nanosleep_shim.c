/* Preloaded before libfaketime (fake_clock.py): clock_nanosleep on a clock libfaketime
 * does not fake goes straight to the kernel.
 *
 * libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 answers EINVAL to every
 * clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ...), which is how Python's time.sleep
 * sleeps: every Ray worker's sleep would fail. The monotonic clocks are real under that
 * setting, so the kernel's answer is the right one; CLOCK_REALTIME still goes through
 * libfaketime, which shifts an absolute deadline by the fake offset. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *request, struct timespec *remain) {
    static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
    if (clock_id != CLOCK_REALTIME) {
        /* clock_nanosleep returns the error number; it does not set errno */
        return syscall(SYS_clock_nanosleep, clock_id, flags, request, remain) == 0 ? 0 : errno;
    }
    if (next == NULL) {
        next = dlsym(RTLD_NEXT, "clock_nanosleep");
    }
    return next(clock_id, flags, request, remain);
}
