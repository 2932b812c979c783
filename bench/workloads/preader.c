/* Benchmark workload in C: reads the files named in LIST (one path per line)
 * with open + pread + close, EPOCHS times; epoch e reads the list rotated by
 * e * 7919 positions (bench/run.py writes the same order for --order-file).
 *
 *   preader LIST EPOCHS [--sync] [--tier NAME=PREFIX ...]
 *
 * One JSON line per epoch: {"epoch", "seconds", "files", "bytes", "tiers":
 * {NAME: opens, ..., "pfs": opens}}, where each open is classified by where
 * its descriptor really points (/proc/self/fd); then {"checksum": "<hex>"},
 * the sum of FNV-1a 64 over every file's content (independent of the order
 * and of where the files are).  With --sync it prints {"sync": e} before
 * each epoch and after the last, and waits for a line on stdin, so that the
 * driver can take the PFS's counters between epochs. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TIERS 8

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

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: preader LIST EPOCHS [--sync] [--tier NAME=PREFIX ...]\n");
        return 2;
    }
    int sync = 0, ntiers = 0;
    char *tier_name[MAX_TIERS], *tier_prefix[MAX_TIERS];
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--sync")) {
            sync = 1;
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
    FILE *list = fopen(argv[1], "r");
    if (!list) {
        perror(argv[1]);
        return 2;
    }
    size_t cap = 1024, n = 0;
    char **paths = malloc(cap * sizeof *paths);
    char line[4096];
    while (fgets(line, sizeof line, list)) {
        line[strcspn(line, "\n")] = '\0';
        if (!*line)
            continue;
        if (n == cap)
            paths = realloc(paths, (cap *= 2) * sizeof *paths);
        paths[n++] = strdup(line);
    }
    fclose(list);
    int epochs = atoi(argv[2]);
    static unsigned char buf[1 << 20];
    uint64_t checksum = 0;
    for (int e = 0; e < epochs; e++) {
        sync_point(sync, e);
        size_t opens[MAX_TIERS + 1] = {0};
        double t0 = now();
        uint64_t bytes = 0;
        size_t stride = n > 1 ? (size_t)e * 7919 % n : 0;
        for (size_t k = 0; k < n; k++) {
            const char *p = paths[(k + stride) % n];
            int fd = open(p, O_RDONLY);
            if (fd < 0) {
                perror(p);
                return 1;
            }
            char link[64], target[4096];
            snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
            ssize_t tl = readlink(link, target, sizeof target - 1);
            target[tl > 0 ? tl : 0] = '\0';
            int where = ntiers;
            for (int t = 0; t < ntiers; t++)
                if (!strncmp(target, tier_prefix[t], strlen(tier_prefix[t])))
                    where = t;
            opens[where]++;
            uint64_t h = 0xcbf29ce484222325ULL;
            off_t off = 0;
            ssize_t r;
            while ((r = pread(fd, buf, sizeof buf, off)) > 0) {
                h = fnv(h, buf, (size_t)r);
                off += r;
            }
            close(fd);
            bytes += (uint64_t)off;
            if (e == 0)
                checksum += h;
        }
        printf("{\"epoch\": %d, \"seconds\": %.6f, \"files\": %zu, \"bytes\": %llu, \"tiers\": {", e,
               now() - t0, n, (unsigned long long)bytes);
        for (int t = 0; t < ntiers; t++)
            printf("\"%s\": %zu, ", tier_name[t], opens[t]);
        printf("\"pfs\": %zu}}\n", opens[ntiers]);
        fflush(stdout);
    }
    sync_point(sync, epochs);
    printf("{\"checksum\": \"%016llx\"}\n", (unsigned long long)checksum);
    return 0;
}
