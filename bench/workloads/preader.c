/* Benchmark workload in C: reads the files named in LIST (one path per line)
 * with open + pread + close, EPOCHS times; epoch e reads the list rotated by
 * e * 7919 positions (bench/run.py writes the same order for --order-file).
 *
 *   preader LIST EPOCHS [--sync] [--threads N] [--order FILE [--root DIR]]
 *                       [--tier NAME=PREFIX ...]
 *
 * --threads N: N threads (default 1) take the next position of the epoch's
 * order from one shared counter; each opens, reads and closes its file.
 * --order FILE: the epochs' orders come from FILE, in the text format of
 * tier-run's --order-file with paths only (one per line; a blank line or a
 * line "# epoch ..." ends an epoch; other lines starting with "#" are
 * comments); relative paths are taken under --root DIR (default: as given).
 * Epoch e reads the file's epoch e mod (its number of epochs): beyond the
 * last the orders wrap around.  LIST is then not read (pass "-").
 *
 * One JSON line per epoch: {"epoch", "seconds", "files", "bytes", "tiers":
 * {NAME: opens, ..., "pfs": opens}}, where each open is classified by where
 * its descriptor really points (/proc/self/fd), summed over the threads;
 * then {"checksum": "<hex>"}, the sum of FNV-1a 64 over the content of every
 * file epoch 1 reads (independent of the order, of the threads and of where
 * the files are).  With --sync it prints {"sync": e} before each epoch and
 * after the last, and waits for a line on stdin, so that the driver can take
 * the PFS's counters between epochs. */
#define _GNU_SOURCE
#include <ctype.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TIERS 8
#define MAX_THREADS 256
#define BUF_SIZE (1 << 20)

struct list {
    char **paths;
    size_t n, cap;
};

static int ntiers;
static char *tier_name[MAX_TIERS], *tier_prefix[MAX_TIERS];
static struct list *order;          /* this epoch's paths */
static atomic_size_t next_pos;      /* the next position of order to read */

struct worker {
    pthread_t tid;
    unsigned char *buf;
    size_t opens[MAX_TIERS + 1];
    uint64_t bytes, checksum;
};

static void push(struct list *l, const char *p)
{
    if (l->n == l->cap)
        l->paths = realloc(l->paths, (l->cap = l->cap ? 2 * l->cap : 1024) * sizeof *l->paths);
    l->paths[l->n++] = strdup(p);
}

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sync_point(int on, int e)
{
    char line[64];
    if (!on)
        return;
    printf("{\"sync\": %d}\n", e);
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        exit(1);
}

static void *reader(void *arg)
{
    struct worker *w = arg;
    size_t k;
    while ((k = atomic_fetch_add(&next_pos, 1)) < order->n) {
        const char *p = order->paths[k];
        int fd = open(p, O_RDONLY);
        if (fd < 0) {
            perror(p);
            exit(1);
        }
        char link[64], target[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t tl = readlink(link, target, sizeof target - 1);
        target[tl > 0 ? tl : 0] = '\0';
        int where = ntiers;
        for (int t = 0; t < ntiers; t++)
            if (!strncmp(target, tier_prefix[t], strlen(tier_prefix[t])))
                where = t;
        w->opens[where]++;
        uint64_t h = 0xcbf29ce484222325ULL;
        off_t off = 0;
        ssize_t r;
        while ((r = pread(fd, w->buf, BUF_SIZE, off)) > 0) {
            h = fnv(h, w->buf, (size_t)r);
            off += r;
        }
        close(fd);
        w->bytes += (uint64_t)off;
        w->checksum += h;
    }
    return NULL;
}

/* A line "# epoch ..." (as tier-run's #\s*epoch\b, any case) ends an epoch. */
static int epoch_line(const char *s)
{
    if (*s++ != '#')
        return 0;
    s += strspn(s, " \t");
    return !strncasecmp(s, "epoch", 5) && !(isalnum((unsigned char)s[5]) || s[5] == '_');
}

/* The epochs of an order file (paths only), relative paths under root. */
static size_t read_orders(const char *file, const char *root, struct list *epochs, size_t max)
{
    FILE *f = fopen(file, "r");
    if (!f) {
        perror(file);
        exit(2);
    }
    size_t ne = 0;
    char line[4096], path[8192];
    while (fgets(line, sizeof line, f)) {
        char *s = line + strspn(line, " \t\r\n"), *end = s + strlen(s);
        while (end > s && strchr(" \t\r\n", end[-1]))
            *--end = '\0';
        if (!*s || epoch_line(s)) {
            ne += epochs[ne].n > 0;
            continue;
        }
        if (*s == '#')
            continue;
        if (ne == max) {
            fprintf(stderr, "preader: %s: more than %zu epochs\n", file, max);
            exit(2);
        }
        int rel = root && *s != '/';
        snprintf(path, sizeof path, "%s%s%s", rel ? root : "", rel ? "/" : "", s);
        push(&epochs[ne], path);
    }
    fclose(f);
    return ne + (ne < max && epochs[ne].n > 0);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: preader LIST EPOCHS [--sync] [--threads N] [--order FILE [--root DIR]] "
                        "[--tier NAME=PREFIX ...]\n");
        return 2;
    }
    int sync = 0, nthreads = 1;
    const char *order_file = NULL, *root = NULL;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--sync")) {
            sync = 1;
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            nthreads = atoi(argv[++i]);
            if (nthreads < 1 || nthreads > MAX_THREADS) {
                fprintf(stderr, "preader: --threads takes 1 to %d\n", MAX_THREADS);
                return 2;
            }
        } else if (!strcmp(argv[i], "--order") && i + 1 < argc) {
            order_file = argv[++i];
        } else if (!strcmp(argv[i], "--root") && i + 1 < argc) {
            root = argv[++i];
        } else if (!strcmp(argv[i], "--tier") && i + 1 < argc && ntiers < MAX_TIERS) {
            char *eq = strchr(argv[++i], '=');
            if (!eq)
                return 2;
            *eq = '\0';
            tier_name[ntiers] = argv[i];
            tier_prefix[ntiers++] = eq + 1;
        } else {
            fprintf(stderr, "preader: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    int epochs = atoi(argv[2]);
    static struct list lists[1024];
    size_t norders = 1;
    if (order_file) {
        norders = read_orders(order_file, root, lists, sizeof lists / sizeof lists[0]);
        if (!norders) {
            fprintf(stderr, "preader: %s: no paths in it\n", order_file);
            return 2;
        }
    } else {
        FILE *list = fopen(argv[1], "r");
        if (!list) {
            perror(argv[1]);
            return 2;
        }
        char line[4096];
        while (fgets(line, sizeof line, list)) {
            line[strcspn(line, "\n")] = '\0';
            if (*line)
                push(&lists[0], line);
        }
        fclose(list);
    }
    struct list rotated = {0};
    struct worker w[MAX_THREADS];
    uint64_t checksum = 0;
    for (int e = 0; e < epochs; e++) {
        if (order_file) {
            order = &lists[(size_t)e % norders];
        } else {    /* the list rotated by e * 7919 */
            size_t n = lists[0].n, stride = n > 1 ? (size_t)e * 7919 % n : 0;
            if (!rotated.paths)
                rotated.paths = malloc((n ? n : 1) * sizeof *rotated.paths);
            for (size_t k = 0; k < n; k++)
                rotated.paths[k] = lists[0].paths[(k + stride) % n];
            rotated.n = n;
            order = &rotated;
        }
        sync_point(sync, e);
        atomic_store(&next_pos, 0);
        memset(w, 0, sizeof w);
        double t0 = now();
        for (int t = 0; t < nthreads; t++) {
            if (!(w[t].buf = malloc(BUF_SIZE)) || pthread_create(&w[t].tid, NULL, reader, &w[t])) {
                fprintf(stderr, "preader: cannot start thread %d\n", t);
                return 1;
            }
        }
        size_t opens[MAX_TIERS + 1] = {0};
        uint64_t bytes = 0, sum = 0;
        for (int t = 0; t < nthreads; t++) {
            pthread_join(w[t].tid, NULL);
            free(w[t].buf);
            for (int k = 0; k <= ntiers; k++)
                opens[k] += w[t].opens[k];
            bytes += w[t].bytes;
            sum += w[t].checksum;
        }
        double seconds = now() - t0;
        if (e == 0)
            checksum = sum;
        printf("{\"epoch\": %d, \"seconds\": %.6f, \"files\": %zu, \"bytes\": %llu, \"tiers\": {", e, seconds,
               order->n, (unsigned long long)bytes);
        for (int t = 0; t < ntiers; t++)
            printf("\"%s\": %zu, ", tier_name[t], opens[t]);
        printf("\"pfs\": %zu}}\n", opens[ntiers]);
        fflush(stdout);
    }
    sync_point(sync, epochs);
    printf("{\"checksum\": \"%016llx\"}\n", (unsigned long long)checksum);
    return 0;
}
