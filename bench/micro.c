/* Microbenchmark of libtiershim.so: the cost of one open+close, and read
 * throughput, measured in whatever environment the program is started in
 * (with or without LD_PRELOAD / TIERING_INDEX; bench/micro.py drives it).
 *
 *   micro open PATH [--iterations N] [--warmup N] [--batches B] [--cwd DIR]
 *                   [--expect TARGET] [--label L]
 *   micro read PATH [--chunk BYTES] [--passes P] [--expect TARGET] [--label L]
 *   micro stat PATH [--iterations N] [--warmup N] [--batches B] [--cwd DIR]
 *                   [--expect TARGET] [--label L]
 *
 * open: chdir(DIR) first when --cwd is given (PATH may then be relative),
 *   then opens PATH once and checks through /proc/self/fd that the
 *   descriptor points at TARGET (exit 3 otherwise), then times N
 *   open(PATH, O_RDONLY | O_CLOEXEC) + close pairs after a warm-up, in B
 *   batches of N/B, with clock_gettime(CLOCK_MONOTONIC).
 * read: the same check, then P passes of open + read(CHUNK) to EOF + close
 *   after one warm-up pass; MB/s (10^6 bytes) per pass.
 * stat: the same check, then times N stat(PATH) calls as open times its
 *   open+close pairs.
 *
 * Prints one line of JSON: the median, minimum and maximum over the batches
 * (passes), every batch's value and the target the descriptor pointed at.
 * Exit status: 0 ok, 2 usage or I/O error, 3 the descriptor pointed elsewhere.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_BATCHES 1000

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void json_str(const char *s)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median, min, max of v[0..n) (v is left unchanged) */
static void stats(const double *v, int n, double *med, double *lo, double *hi)
{
    double s[MAX_BATCHES];
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    *med = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    *lo = s[0];
    *hi = s[n - 1];
}

/* Opens path once and writes where the descriptor points into target.
 * Returns 0, or exits 2 (cannot open) or 3 (points elsewhere than expect). */
static void verify(const char *path, const char *expect, char *target, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "micro: open %s: %s\n", path, strerror(errno));
        exit(2);
    }
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, cap - 1);
    close(fd);
    if (n <= 0) {
        fprintf(stderr, "micro: readlink %s: %s\n", link, strerror(errno));
        exit(2);
    }
    target[n] = '\0';
    if (expect && strcmp(target, expect) != 0) {
        fprintf(stderr, "micro: %s opened %s, expected %s\n", path, target, expect);
        exit(3);
    }
}

static void print_head(const char *mode, const char *label, const char *path, const char *cwd,
                       const char *target)
{
    printf("{\"mode\": ");
    json_str(mode);
    printf(", \"label\": ");
    json_str(label ? label : "");
    printf(", \"path\": ");
    json_str(path);
    printf(", \"cwd\": ");
    if (cwd)
        json_str(cwd);
    else
        printf("null");
    printf(", \"target\": ");
    json_str(target);
}

static void print_values(const char *key, const double *v, int n)
{
    printf(", \"%s\": [", key);
    for (int i = 0; i < n; i++)
        printf("%s%.2f", i ? ", " : "", v[i]);
    putchar(']');
}

/* One timed call: open+close, or stat; 0 on success. */
static inline int one_call(int stat_mode, const char *path)
{
    if (stat_mode) {
        struct stat st;
        return stat(path, &st);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (__builtin_expect(fd < 0, 0))
        return -1;
    close(fd);
    return 0;
}

static int bench_calls(const char *mode, const char *path, const char *label, const char *cwd,
                       const char *target, long iterations, long warmup, int batches)
{
    int stat_mode = strcmp(mode, "stat") == 0;
    long per = iterations / batches;
    if (per < 1)
        per = 1;
    for (long i = 0; i < warmup; i++) {
        if (one_call(stat_mode, path) != 0) {
            fprintf(stderr, "micro: %s %s: %s\n", mode, path, strerror(errno));
            return 2;
        }
    }
    double ns[MAX_BATCHES];
    for (int b = 0; b < batches; b++) {
        uint64_t t0 = now_ns();
        for (long i = 0; i < per; i++) {
            if (__builtin_expect(one_call(stat_mode, path) != 0, 0)) {
                fprintf(stderr, "micro: %s %s: %s\n", mode, path, strerror(errno));
                return 2;
            }
        }
        ns[b] = (double)(now_ns() - t0) / (double)per;
    }
    double med, lo, hi;
    stats(ns, batches, &med, &lo, &hi);
    print_head(mode, label, path, cwd, target);
    printf(", \"iterations\": %ld, \"warmup\": %ld, \"batches\": %d, \"ns\": %.2f, "
           "\"ns_min\": %.2f, \"ns_max\": %.2f",
           per * batches, warmup, batches, med, lo, hi);
    print_values("batch_ns", ns, batches);
    printf("}\n");
    return 0;
}

static int read_pass(const char *path, char *buf, size_t chunk, uint64_t *bytes)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "micro: open %s: %s\n", path, strerror(errno));
        return -1;
    }
    uint64_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, chunk);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "micro: read %s: %s\n", path, strerror(errno));
            close(fd);
            return -1;
        }
        if (n == 0)
            break;
        total += (uint64_t)n;
    }
    close(fd);
    *bytes = total;
    return 0;
}

static int bench_read(const char *path, const char *label, const char *target, size_t chunk,
                      int passes)
{
    char *buf = aligned_alloc(4096, (chunk + 4095) / 4096 * 4096);
    if (!buf) {
        fprintf(stderr, "micro: out of memory\n");
        return 2;
    }
    memset(buf, 0, chunk);
    uint64_t bytes = 0;
    if (read_pass(path, buf, chunk, &bytes) < 0) /* warm-up */
        return 2;
    double mbs[MAX_BATCHES];
    for (int p = 0; p < passes; p++) {
        uint64_t t0 = now_ns();
        if (read_pass(path, buf, chunk, &bytes) < 0)
            return 2;
        uint64_t dt = now_ns() - t0;
        mbs[p] = (double)bytes / ((double)(dt ? dt : 1) / 1e9) / 1e6;
    }
    double med, lo, hi;
    stats(mbs, passes, &med, &lo, &hi);
    print_head("read", label, path, NULL, target);
    printf(", \"bytes\": %llu, \"chunk\": %zu, \"passes\": %d, \"mb_s\": %.1f, "
           "\"mb_s_min\": %.1f, \"mb_s_max\": %.1f",
           (unsigned long long)bytes, chunk, passes, med, lo, hi);
    print_values("pass_mb_s", mbs, passes);
    printf("}\n");
    free(buf);
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: micro open PATH [--iterations N] [--warmup N] [--batches B] [--cwd DIR]\n"
            "                       [--expect TARGET] [--label L]\n"
            "       micro read PATH [--chunk BYTES] [--passes P] [--expect TARGET] [--label L]\n"
            "       micro stat PATH [--iterations N] [--warmup N] [--batches B] [--cwd DIR]\n"
            "                       [--expect TARGET] [--label L]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    if (argc < 3)
        usage();
    const char *mode = argv[1], *path = argv[2];
    const char *cwd = NULL, *expect = NULL, *label = NULL;
    long iterations = 200000, warmup = -1, chunk = 1 << 20;
    int batches = 10, passes = 5;
    static const struct option opts[] = {
        {"iterations", required_argument, 0, 'n'}, {"warmup", required_argument, 0, 'w'},
        {"batches", required_argument, 0, 'b'},    {"cwd", required_argument, 0, 'c'},
        {"expect", required_argument, 0, 'e'},     {"label", required_argument, 0, 'l'},
        {"chunk", required_argument, 0, 'k'},      {"passes", required_argument, 0, 'p'},
        {0, 0, 0, 0}};
    optind = 3;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'n': iterations = atol(optarg); break;
        case 'w': warmup = atol(optarg); break;
        case 'b': batches = atoi(optarg); break;
        case 'c': cwd = optarg; break;
        case 'e': expect = optarg; break;
        case 'l': label = optarg; break;
        case 'k': chunk = atol(optarg); break;
        case 'p': passes = atoi(optarg); break;
        default: usage();
        }
    }
    if (optind != argc || iterations < 1 || batches < 1 || batches > MAX_BATCHES || chunk < 1 ||
        passes < 1 || passes > MAX_BATCHES)
        usage();
    if (warmup < 0)
        warmup = iterations / 10;
    if (cwd && chdir(cwd) != 0) {
        fprintf(stderr, "micro: chdir %s: %s\n", cwd, strerror(errno));
        return 2;
    }
    char target[PATH_MAX];
    verify(path, expect, target, sizeof target);
    if (strcmp(mode, "open") == 0 || strcmp(mode, "stat") == 0)
        return bench_calls(mode, path, label, cwd, target, iterations, warmup, batches);
    if (strcmp(mode, "read") == 0)
        return bench_read(path, label, target, (size_t)chunk, passes);
    usage();
    return 2;
}
