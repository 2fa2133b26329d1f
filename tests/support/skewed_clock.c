/* An LD_PRELOAD shim that sets this process's wall clock off by SKEW_SECONDS (a float read
 * from the environment, e.g. "-4" or "6.5"): CLOCK_REALTIME (and its coarse variant),
 * gettimeofday() and time() answer the real time plus the skew. Every other clock is left
 * alone, so monotonic deadlines and timed waits (sleep, locks, conditions) keep working:
 * libfaketime 0.9.10 breaks them in Python one way or the other (a timed wait hangs with its
 * monotonic clock faked, time.sleep() fails with EINVAL without). Built by
 * tests/support/skew.py. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long skew_ns(void) {
    static int known = 0;
    static long long ns = 0;
    if (!known) {
        const char *text = getenv("SKEW_SECONDS");
        ns = text ? (long long)(atof(text) * 1e9) : 0;
        known = 1;
    }
    return ns;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = 0;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int rc = real(id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long t = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + skew_ns();
        ts->tv_sec = (time_t)(t / 1000000000LL);
        ts->tv_nsec = (long)(t % 1000000000LL);
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
