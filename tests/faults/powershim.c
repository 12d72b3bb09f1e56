/* Power loss in LazyFS's model, without FUSE: LD_PRELOADed into nsqd, it journals what each
 * write to a file under NSQX_POWER_DIR overwrote, and which syncs made data durable; after
 * kill -9, tests/faults/power.py replays the journal backwards and undoes every write that
 * no later fsync/fdatasync of its file (or syncfs/sync) covered: the files hold what a
 * machine losing power at that instant would have kept of their data. Metadata operations
 * (create, rename, unlink) go through, as in LazyFS. Unlike a FUSE layer this sees syncfs(2),
 * which nsqx's interval fsync uses.
 *
 * Journal records (appended with one write(2) each, O_APPEND, under a mutex):
 *   'W' u32 pathlen, path, u64 offset, u64 len, u64 size_before, u64 oldlen, old bytes
 *   'T' u32 pathlen, path, u64 new_size, u64 size_before, u64 oldlen, old bytes  (truncate)
 *   'S' u32 pathlen, path          (fsync/fdatasync of that file)
 *   'A'                            (syncfs/sync: everything)
 *   'R' u32 len, from, u32 len, to (rename)   'U' u32 len, path (unlink)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int jfd = -1;
static const char *root;
static size_t root_len;

#define REAL(ret, name, ...) \
    static ret (*real_##name)(__VA_ARGS__); \
    if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

static int setup(void) {
    if (jfd >= 0) return 1;
    root = getenv("NSQX_POWER_DIR");
    const char *jpath = getenv("NSQX_POWER_JOURNAL");
    if (!root || !jpath) return 0;
    root_len = strlen(root);
    jfd = open(jpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    return jfd >= 0;
}

static int fd_path(int fd, char *out) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, out, PATH_MAX - 1);
    if (n <= 0) return 0;
    out[n] = 0;
    return strncmp(out, root, root_len) == 0;
}

static int abs_path(const char *p, char *out) {
    if (p[0] == '/') snprintf(out, PATH_MAX, "%s", p);
    else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return 0;
        snprintf(out, PATH_MAX, "%s/%s", cwd, p);
    }
    return strncmp(out, root, root_len) == 0;
}

static void put(char **b, const void *src, size_t n) { memcpy(*b, src, n); *b += n; }

static void emit(const char *buf, size_t n) {
    REAL(ssize_t, write, int, const void *, size_t);
    while (n) {
        ssize_t w = real_write(jfd, buf, n);
        if (w <= 0) return;
        buf += w; n -= (size_t)w;
    }
}

static uint64_t cur(int fd) {
    int flags = fcntl(fd, F_GETFL);
    struct stat st;
    if (flags >= 0 && (flags & O_APPEND) && fstat(fd, &st) == 0) return (uint64_t)st.st_size;
    off_t o = lseek(fd, 0, SEEK_CUR);
    return o < 0 ? 0 : (uint64_t)o;
}

/* journal what [off, off+len) of fd held before a write ('W') or truncate ('T') */
static void before_change(int fd, char kind, uint64_t off, uint64_t len) {
    char path[PATH_MAX];
    struct stat st;
    if (!setup() || !fd_path(fd, path) || fstat(fd, &st) || !S_ISREG(st.st_mode)) return;
    REAL(ssize_t, pread, int, void *, size_t, off_t);
    if (off == UINT64_MAX) off = cur(fd);
    uint64_t size = (uint64_t)st.st_size;
    if (kind == 'T') { len = size > off ? size - off : 0; }
    uint64_t oldlen = off < size ? (size - off < len ? size - off : len) : 0;
    uint32_t pl = (uint32_t)strlen(path);
    char *rec = malloc(1 + 4 + pl + 40 + oldlen), *b = rec;
    if (!rec) return;
    put(&b, &kind, 1); put(&b, &pl, 4); put(&b, path, pl); put(&b, &off, 8);
    if (kind == 'W') put(&b, &len, 8);
    put(&b, &size, 8);
    char *lenp = b;
    b += 8;
    if (oldlen && real_pread(fd, b, oldlen, (off_t)off) != (ssize_t)oldlen) {
        /* a write-only descriptor: read the old bytes through one of our own */
        int rfd = open(path, O_RDONLY | O_CLOEXEC);
        if (rfd < 0 || real_pread(rfd, b, oldlen, (off_t)off) != (ssize_t)oldlen) oldlen = 0;
        if (rfd >= 0) close(rfd);
    }
    memcpy(lenp, &oldlen, 8);  /* the length of the old bytes actually journaled */
    b += oldlen;
    pthread_mutex_lock(&mu);
    emit(rec, (size_t)(b - rec));
    pthread_mutex_unlock(&mu);
    free(rec);
}

static void mark(char kind, const char *a, const char *c) {
    char buf[2 * PATH_MAX + 16], *b = buf;
    put(&b, &kind, 1);
    if (a) { uint32_t l = (uint32_t)strlen(a); put(&b, &l, 4); put(&b, a, l); }
    if (c) { uint32_t l = (uint32_t)strlen(c); put(&b, &l, 4); put(&b, c, l); }
    pthread_mutex_lock(&mu);
    emit(buf, (size_t)(b - buf));
    pthread_mutex_unlock(&mu);
}

ssize_t write(int fd, const void *buf, size_t n) {
    REAL(ssize_t, write, int, const void *, size_t);
    if (fd != jfd) before_change(fd, 'W', UINT64_MAX, n);
    return real_write(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL(ssize_t, pwrite, int, const void *, size_t, off_t);
    before_change(fd, 'W', (uint64_t)off, n);
    return real_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    REAL(ssize_t, pwrite64, int, const void *, size_t, off_t);
    before_change(fd, 'W', (uint64_t)off, n);
    return real_pwrite64(fd, buf, n, off);
}

static size_t iov_len(const struct iovec *iov, int cnt) {
    size_t n = 0;
    for (int i = 0; i < cnt; i++) n += iov[i].iov_len;
    return n;
}

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    REAL(ssize_t, writev, int, const struct iovec *, int);
    before_change(fd, 'W', UINT64_MAX, iov_len(iov, cnt));
    return real_writev(fd, iov, cnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off) {
    REAL(ssize_t, pwritev, int, const struct iovec *, int, off_t);
    before_change(fd, 'W', (uint64_t)off, iov_len(iov, cnt));
    return real_pwritev(fd, iov, cnt, off);
}

int ftruncate(int fd, off_t len) {
    REAL(int, ftruncate, int, off_t);
    before_change(fd, 'T', (uint64_t)len, 0);
    return real_ftruncate(fd, len);
}

int ftruncate64(int fd, off_t len) {
    REAL(int, ftruncate64, int, off_t);
    before_change(fd, 'T', (uint64_t)len, 0);
    return real_ftruncate64(fd, len);
}

static void synced(int fd) {
    char path[PATH_MAX];
    if (setup() && fd_path(fd, path)) mark('S', path, NULL);
}

int fsync(int fd) {
    REAL(int, fsync, int);
    int r = real_fsync(fd);
    if (r == 0) synced(fd);
    return r;
}

int fdatasync(int fd) {
    REAL(int, fdatasync, int);
    int r = real_fdatasync(fd);
    if (r == 0) synced(fd);
    return r;
}

int syncfs(int fd) {
    REAL(int, syncfs, int);
    int r = real_syncfs(fd);
    if (r == 0 && setup()) mark('A', NULL, NULL);
    return r;
}

void sync(void) {
    REAL(void, sync, void);
    real_sync();
    if (setup()) mark('A', NULL, NULL);
}

int rename(const char *a, const char *b) {
    REAL(int, rename, const char *, const char *);
    char pa[PATH_MAX], pb[PATH_MAX];
    int r = real_rename(a, b);
    if (r == 0 && setup() && abs_path(a, pa) && abs_path(b, pb)) mark('R', pa, pb);
    return r;
}

int unlink(const char *p) {
    REAL(int, unlink, const char *);
    char pa[PATH_MAX];
    int r = real_unlink(p);
    if (r == 0 && setup() && abs_path(p, pa)) mark('U', pa, NULL);
    return r;
}
