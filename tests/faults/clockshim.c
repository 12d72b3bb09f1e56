/* A wall clock the fault suite can shift: LD_PRELOADed into one nsqd, it adds the offset
 * (nanoseconds, text) found in the file named by NSQX_CLOCK_FILE to CLOCK_REALTIME and its
 * relatives (clock_gettime, gettimeofday, time). The monotonic clock is left alone, as a
 * real clock jump leaves it. The file is read again at most every 50 ms of monotonic time.
 * (libfaketime fakes sleeps too, and Python's clock_nanosleep fails under it with EINVAL.) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static long long offset_ns;
static struct timespec last_read;

static long long current_offset(void) {
    struct timespec now;
    const char *path = getenv("NSQX_CLOCK_FILE");
    if (!path) return 0;
    real_clock_gettime(CLOCK_MONOTONIC, &now);
    long long since = (now.tv_sec - last_read.tv_sec) * 1000000000LL + now.tv_nsec - last_read.tv_nsec;
    if (last_read.tv_sec == 0 || since > 50000000LL) {
        FILE *f = fopen(path, "r");
        long long v;
        if (f) {
            if (fscanf(f, "%lld", &v) == 1) offset_ns = v;
            fclose(f);
        }
        last_read = now;
    }
    return offset_ns;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (!real_clock_gettime) real_clock_gettime = dlsym(RTLD_NEXT, "clock_gettime");
    int r = real_clock_gettime(id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI)) {
        long long t = ts->tv_sec * 1000000000LL + ts->tv_nsec + current_offset();
        ts->tv_sec = t / 1000000000LL;
        ts->tv_nsec = t % 1000000000LL;
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    clock_gettime(CLOCK_REALTIME, &ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
