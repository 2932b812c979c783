/* The scale benchmark's helpers in C (bench/scale/__init__.py builds and runs them).
 *
 *   scaletool tree ROOT FILES CLASSES SIZE SEED THREADS
 *       ImageNet's shape: CLASSES directories n00000000.. (sorted = class index),
 *       FILES files spread as evenly as ImageNet's (the first FILES % CLASSES
 *       classes get one more), named <class>_<7-digit index>.JPEG so that the
 *       sorted walk is the index order.  File i holds SIZE bytes that depend only
 *       on (SEED, i).  Existing files of the right size are kept.
 *   scaletool large DIR COUNT SIZE SEED
 *       COUNT files big-<k>.bin of SIZE bytes of pseudo-random data (real blocks).
 *   scaletool stamp FILE
 *       Writes the wall-clock time (seconds since the epoch) to FILE.
 *   scaletool read LIST OUT SRCDIR [-p PHASE ...]
 *       Reads the files named in LIST (one path per line) in that order, phase by
 *       phase, and writes OUT (JSON).  Each open is counted as "pfs" when the
 *       descriptor is the path's own inode on SRCDIR's file system, else "tier".  Phases:
 *         paced,RATE,SECONDS   one thread, RATE opens/s, for SECONDS (or to the end)
 *         full,THREADS[,END]   the rest of LIST (up to position END) as fast as
 *                              THREADS threads go; each takes the next 64
 *                              positions, so the reads follow LIST as DataLoader
 *                              workers do
 *         opens,THREADS[,END]  as full, but each file is opened
 *                              and closed without reading it: the events of a
 *                              reader faster than these cores let one that reads
 *                              go; an open is counted as "tier" when the descriptor
 *                              is on another file system than SRCDIR (the kernel's
 *                              fstat: no path to resolve per file), so a tier on
 *                              SRCDIR's own file system counts as "pfs"
 *         wait,WAITLIST,TIERDIR,SECONDS  polls, without opening anything, until
 *                              every relative path of WAITLIST (below SRCDIR)
 *                              is served from a tier (the shim's tiering_where;
 *                              without the shim: TIERDIR/tiering-* /[* /[* /]]REL
 *                              exists), in list order; gives up after SECONDS
 *                              without a new one
 *       OUT: {"start", "exit", "checksum", "files", "bytes", "phases": [{"kind",
 *       "start", "end", "files", "bytes", "tier", "pfs", "waited"}]}; the checksum
 *       is the sum of FNV-1a 64 of every file read (independent of order and of
 *       where the copy was).  A failed open or read exits 1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define CHUNK 64
#define MAX_PHASES 16

static double wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void fill(unsigned char *buf, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t k = 0; k < n; k += 8) {
        uint64_t v = splitmix(&s);
        memcpy(buf + k, &v, n - k < 8 ? n - k : 8);
    }
}

static int write_file(const char *path, const unsigned char *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror(path);
        return -1;
    }
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, buf + done, n - done);
        if (w <= 0) {
            perror(path);
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    return close(fd);
}

/* ---- tree ---- */

struct tree {
    const char *root;
    long files, classes, size;
    uint64_t seed;
    long next_class;
    pthread_mutex_t lock;
    int failed;
};

static long class_first(const struct tree *t, long c)
{
    long base = t->files / t->classes, extra = t->files % t->classes;
    return c * base + (c < extra ? c : extra);
}

static void *tree_worker(void *arg)
{
    struct tree *t = arg;
    unsigned char *buf = malloc((size_t)t->size + 8);
    char path[4096];
    for (;;) {
        pthread_mutex_lock(&t->lock);
        long c = t->failed ? t->classes : t->next_class++;
        pthread_mutex_unlock(&t->lock);
        if (c >= t->classes)
            break;
        snprintf(path, sizeof path, "%s/n%08ld", t->root, c);
        if (mkdir(path, 0755) < 0 && errno != EEXIST) {
            perror(path);
            t->failed = 1;
            break;
        }
        for (long i = class_first(t, c); i < class_first(t, c + 1); i++) {
            struct stat st;
            snprintf(path, sizeof path, "%s/n%08ld/n%08ld_%07ld.JPEG", t->root, c, c, i);
            if (stat(path, &st) == 0 && st.st_size == t->size)
                continue;
            fill(buf, (size_t)t->size, t->seed * 0x100000001b3ULL + (uint64_t)i);
            if (write_file(path, buf, (size_t)t->size) < 0) {
                t->failed = 1;
                break;
            }
        }
    }
    free(buf);
    return NULL;
}

static int cmd_tree(int argc, char **argv)
{
    if (argc != 8)
        return 2;
    struct tree t = {.root = argv[2], .files = atol(argv[3]), .classes = atol(argv[4]),
                     .size = atol(argv[5]), .seed = strtoull(argv[6], NULL, 10)};
    int threads = atoi(argv[7]);
    if (t.files < 1 || t.classes < 1 || t.size < 0 || threads < 1 || threads > 64)
        return 2;
    pthread_mutex_init(&t.lock, NULL);
    if (mkdir(t.root, 0755) < 0 && errno != EEXIST) {
        perror(t.root);
        return 1;
    }
    pthread_t th[64];
    for (int k = 0; k < threads; k++)
        pthread_create(&th[k], NULL, tree_worker, &t);
    for (int k = 0; k < threads; k++)
        pthread_join(th[k], NULL);
    return t.failed;
}

/* ---- large ---- */

static int cmd_large(int argc, char **argv)
{
    if (argc != 6)
        return 2;
    long count = atol(argv[3]);
    size_t size = strtoull(argv[4], NULL, 10), block = 1 << 20;
    uint64_t seed = strtoull(argv[5], NULL, 10);
    unsigned char *buf = malloc(block);
    char path[4096];
    if (mkdir(argv[2], 0755) < 0 && errno != EEXIST) {
        perror(argv[2]);
        return 1;
    }
    for (long k = 0; k < count; k++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/big-%ld.bin", argv[2], k);
        if (stat(path, &st) == 0 && (size_t)st.st_size == size)
            continue;
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) {
            perror(path);
            return 1;
        }
        for (size_t off = 0; off < size; off += block) {
            size_t n = size - off < block ? size - off : block;
            fill(buf, n, seed * 0x100000001b3ULL + (uint64_t)k * 0x10000000ULL + off / block);
            if (write(fd, buf, n) != (ssize_t)n) {
                perror(path);
                return 1;
            }
        }
        close(fd);
    }
    free(buf);
    return 0;
}

/* ---- stamp ---- */

static int cmd_stamp(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    FILE *f = fopen(argv[2], "w");
    if (!f)
        return 1;
    fprintf(f, "%.6f\n", wall());
    return fclose(f) != 0;
}

/* ---- read ---- */

struct phase {
    char kind[8];
    double rate, seconds;
    int threads;
    size_t stop;             /* full, opens: the position they stop before (0: LIST's end) */
    const char *waitlist, *tierdir;
    /* results */
    double start, end;
    size_t files, tier, pfs, waited;
    uint64_t bytes;
};

struct reader {
    char **paths;
    size_t n;
    dev_t src_dev;           /* SRCDIR's file system (opens: where a descriptor is not a copy) */
    size_t pos;              /* next position (shared by the full threads) */
    uint64_t checksum;
    pthread_mutex_t lock;
    int failed;
};

/* What a reading thread counted since it last added it to its phase. */
struct tally {
    uint64_t checksum, bytes;
    size_t files, tier, pfs;
};

static void add_tally(struct reader *r, struct phase *ph, struct tally *t)
{
    pthread_mutex_lock(&r->lock);
    r->checksum += t->checksum;
    ph->files += t->files;
    ph->bytes += t->bytes;
    ph->tier += t->tier;
    ph->pfs += t->pfs;
    pthread_mutex_unlock(&r->lock);
    memset(t, 0, sizeof *t);
}

static int read_one(const char *p, unsigned char *buf, size_t cap, struct tally *t)
{
    int fd = open(p, O_RDONLY);
    if (fd < 0) {
        perror(p);
        return -1;
    }
    /* where the descriptor really points (the shim answers stat and fstat
     * from the index, so only the kernel's link tells a copy from the source) */
    char link[64], where[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t wn = readlink(link, where, sizeof where - 1);
    if (wn < 0) {
        perror(link);
        close(fd);
        return -1;
    }
    where[wn] = '\0';
    uint64_t h = 0xcbf29ce484222325ULL;
    off_t off = 0;
    ssize_t got;
    while ((got = pread(fd, buf, cap, off)) > 0) {
        for (ssize_t k = 0; k < got; k++) {
            h ^= buf[k];
            h *= 0x100000001b3ULL;
        }
        off += got;
    }
    close(fd);
    if (got < 0) {
        perror(p);
        return -1;
    }
    t->checksum += h;
    t->files++;
    t->bytes += (uint64_t)off;
    if (strcmp(where, p) == 0)
        t->pfs++;
    else
        t->tier++;
    return 0;
}

static void sleep_until(double t)
{
    double d = t - wall();
    if (d <= 0)
        return;
    struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
}

static int run_paced(struct reader *r, struct phase *ph)
{
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    double t0 = wall();
    size_t k = 0;
    struct tally t = {0};
    int rc = 0;
    while (r->pos < r->n && wall() - t0 < ph->seconds) {
        sleep_until(t0 + (double)k / ph->rate);
        if (read_one(r->paths[r->pos++], buf, cap, &t) < 0) {
            rc = -1;
            break;
        }
        k++;
    }
    add_tally(r, ph, &t);
    free(buf);
    return rc;
}

struct full_arg {
    struct reader *r;
    struct phase *ph;
    size_t end;              /* positions before this one */
};

/* stat through the kernel, not the shim's answer from its index (newfstatat
 * as shim/tiercopy.c calls it: 64-bit Linux) */
static long kernel_stat(int dirfd, const char *path, struct stat *st, int flags)
{
    return syscall(SYS_newfstatat, dirfd, path, st, flags);
}

/* opens: open and close without reading; where the descriptor is, from the
 * kernel's fstat (the shim answers fstat from the index). */
static int open_one(const struct reader *r, const char *p, struct tally *t)
{
    int fd = open(p, O_RDONLY);
    if (fd < 0) {
        perror(p);
        return -1;
    }
    struct stat st;
    if (kernel_stat(fd, "", &st, AT_EMPTY_PATH) < 0) {
        perror(p);
        close(fd);
        return -1;
    }
    close(fd);
    t->files++;
    if (st.st_dev == r->src_dev)
        t->pfs++;
    else
        t->tier++;
    return 0;
}

static void *full_worker(void *arg)
{
    struct full_arg *a = arg;
    struct reader *r = a->r;
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    struct tally t = {0};
    int opens = !strcmp(a->ph->kind, "opens");
    for (;;) {
        size_t first = __atomic_fetch_add(&r->pos, CHUNK, __ATOMIC_RELAXED);
        if (first >= a->end || r->failed)
            break;
        size_t last = first + CHUNK < a->end ? first + CHUNK : a->end;
        for (size_t k = first; k < last; k++)
            if ((opens ? open_one(r, r->paths[k], &t) : read_one(r->paths[k], buf, cap, &t)) < 0) {
                r->failed = 1;
                break;
            }
        add_tally(r, a->ph, &t);      /* once per CHUNK: the threads do not queue on the lock */
    }
    add_tally(r, a->ph, &t);
    free(buf);
    return NULL;
}

static int run_full(struct reader *r, struct phase *ph)
{
    pthread_t th[64];
    size_t end = ph->stop && ph->stop < r->n ? ph->stop : r->n;
    if (end < r->pos)
        end = r->pos;         /* already past END: nothing to read (never back) */
    struct full_arg a = {r, ph, end};
    int n = ph->threads < 1 ? 1 : ph->threads > 64 ? 64 : ph->threads;
    for (int k = 0; k < n; k++)
        pthread_create(&th[k], NULL, full_worker, &a);
    for (int k = 0; k < n; k++)
        pthread_join(th[k], NULL);
    if (r->pos > end)
        r->pos = end;
    return r->failed ? -1 : 0;
}

static char **read_lines(const char *file, size_t *count)
{
    FILE *f = fopen(file, "r");
    if (!f) {
        perror(file);
        return NULL;
    }
    size_t cap = 1024, n = 0;
    char **out = malloc(cap * sizeof *out);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!*line)
            continue;
        if (n == cap)
            out = realloc(out, (cap *= 2) * sizeof *out);
        out[n++] = strdup(line);
    }
    fclose(f);
    *count = n;
    return out;
}

/* Whether TIERDIR holds a copy of REL.  The copies' directory (the part of
 * the first match before REL) is found with glob once, then each file costs
 * one stat. */
static int has_copy(const char *tierdir, const char *rel)
{
    static const char *depth[] = {"%s/tiering-*/%s", "%s/tiering-*/*/%s", "%s/tiering-*/*/*/%s"};
    static char prefix[4096];
    char pat[8192];
    struct stat st;
    if (*prefix) {
        snprintf(pat, sizeof pat, "%s/%s", prefix, rel);
        return stat(pat, &st) == 0;
    }
    for (int d = 0; d < 3; d++) {
        glob_t g;
        snprintf(pat, sizeof pat, depth[d], tierdir, rel);
        if (glob(pat, GLOB_NOSORT, NULL, &g) == 0 && g.gl_pathc > 0) {
            size_t keep = strlen(g.gl_pathv[0]) - strlen(rel) - 1;
            if (keep < sizeof prefix)
                snprintf(prefix, keep + 1, "%s", g.gl_pathv[0]);
            globfree(&g);
            return 1;
        }
        globfree(&g);
    }
    return 0;
}

/* Whether SRCDIR/REL is served from a tier now: under tier-run the shim's
 * tiering_where says so (a copy is renamed into place a moment before it is
 * published); without the shim, whether TIERDIR holds a copy. */
static int served(const char *srcdir, const char *tierdir, const char *rel)
{
    static int (*where)(const char *);
    static int looked;
    if (!looked) {
        where = (int (*)(const char *))dlsym(RTLD_DEFAULT, "tiering_where");
        looked = 1;
    }
    if (!where)
        return has_copy(tierdir, rel);
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", srcdir, rel);
    return where(path) >= 0;
}

static int run_wait(struct phase *ph, const char *srcdir)
{
    size_t n = 0, k = 0;
    char **rels = read_lines(ph->waitlist, &n);
    if (!rels)
        return -1;
    double last = wall();
    while (k < n && wall() - last < ph->seconds) {
        if (served(srcdir, ph->tierdir, rels[k])) {
            k++;
            last = wall();
            continue;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ph->waited = k;
    return 0;
}

static int parse_phase(char *spec, struct phase *ph)
{
    char *f[4] = {0};
    int nf = 0;
    for (char *tok = strtok(spec, ","); tok && nf < 4; tok = strtok(NULL, ","))
        f[nf++] = tok;
    if (nf < 1)
        return -1;
    snprintf(ph->kind, sizeof ph->kind, "%s", f[0]);
    if (!strcmp(f[0], "paced") && nf == 3) {
        ph->rate = atof(f[1]);
        ph->seconds = atof(f[2]);
        return ph->rate > 0 ? 0 : -1;
    }
    if ((!strcmp(f[0], "full") || !strcmp(f[0], "opens")) && (nf == 2 || nf == 3)) {
        ph->threads = atoi(f[1]);
        ph->stop = nf == 3 ? (size_t)strtoull(f[2], NULL, 10) : 0;
        return nf == 2 || ph->stop > 0 ? 0 : -1;
    }
    if (!strcmp(f[0], "wait") && nf == 4) {
        ph->waitlist = f[1];
        ph->tierdir = f[2];
        ph->seconds = atof(f[3]);
        return 0;
    }
    return -1;
}

static int cmd_read(int argc, char **argv)
{
    if (argc < 5)
        return 2;
    struct phase ph[MAX_PHASES];
    int nph = 0;
    memset(ph, 0, sizeof ph);
    for (int i = 5; i < argc; i++) {
        if (strcmp(argv[i], "-p") || i + 1 >= argc || nph == MAX_PHASES ||
            parse_phase(argv[++i], &ph[nph++]) < 0) {
            fprintf(stderr, "scaletool read: bad phase at %s\n", argv[i]);
            return 2;
        }
    }
    struct reader r = {0};
    double start = wall();
    struct stat st;
    if (kernel_stat(AT_FDCWD, argv[4], &st, 0) < 0) {
        perror(argv[4]);
        return 2;
    }
    r.src_dev = st.st_dev;
    pthread_mutex_init(&r.lock, NULL);
    r.paths = read_lines(argv[2], &r.n);
    if (!r.paths)
        return 2;
    int rc = 0;
    for (int k = 0; k < nph && rc == 0; k++) {
        ph[k].start = wall();
        if (!strcmp(ph[k].kind, "paced"))
            rc = run_paced(&r, &ph[k]);
        else if (!strcmp(ph[k].kind, "full") || !strcmp(ph[k].kind, "opens"))
            rc = run_full(&r, &ph[k]);
        else
            rc = run_wait(&ph[k], argv[4]);
        ph[k].end = wall();
    }
    size_t files = 0;
    uint64_t bytes = 0;
    FILE *out = fopen(argv[3], "w");
    if (!out) {
        perror(argv[3]);
        return 1;
    }
    fprintf(out, "{\"start\": %.6f, \"listed\": %zu, \"phases\": [", start, r.n);
    for (int k = 0; k < nph; k++) {
        files += ph[k].files;
        bytes += ph[k].bytes;
        fprintf(out, "%s{\"kind\": \"%s\", \"start\": %.6f, \"end\": %.6f, \"files\": %zu, \"bytes\": %llu, "
                "\"tier\": %zu, \"pfs\": %zu, \"waited\": %zu}", k ? ", " : "", ph[k].kind, ph[k].start,
                ph[k].end, ph[k].files, (unsigned long long)ph[k].bytes, ph[k].tier, ph[k].pfs, ph[k].waited);
    }
    fprintf(out, "], \"files\": %zu, \"bytes\": %llu, \"checksum\": \"%016llx\", \"ok\": %s, \"exit\": %.6f}\n",
            files, (unsigned long long)bytes, (unsigned long long)r.checksum, rc == 0 ? "true" : "false", wall());
    fclose(out);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    int rc = 2;
    if (argc >= 2 && !strcmp(argv[1], "tree"))
        rc = cmd_tree(argc, argv);
    else if (argc >= 2 && !strcmp(argv[1], "large"))
        rc = cmd_large(argc, argv);
    else if (argc >= 2 && !strcmp(argv[1], "stamp"))
        rc = cmd_stamp(argc, argv);
    else if (argc >= 2 && !strcmp(argv[1], "read"))
        rc = cmd_read(argc, argv);
    if (rc == 2)
        fprintf(stderr, "usage: scaletool tree ROOT FILES CLASSES SIZE SEED THREADS | large DIR COUNT SIZE SEED"
                        " | stamp FILE | read LIST OUT SRCDIR [-p PHASE ...]\n");
    return rc;
}
