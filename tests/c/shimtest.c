/* Drives one libc entry point for the shim tests:
 *   shimtest ENTRY PATH OUT [DIR]
 * opens PATH through ENTRY (relative to DIR for the *at forms), copies what
 * it reads to OUT and prints where the descriptor really points. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int __open_2(const char *, int);
int __open64_2(const char *, int);
int __openat_2(int, const char *, int);
int __openat64_2(int, const char *, int);

static int open_with(const char *entry, const char *path, int dirfd, FILE **fp)
{
    *fp = NULL;
    if (!strcmp(entry, "open")) return open(path, O_RDONLY | O_CLOEXEC);
    if (!strcmp(entry, "open64")) return open64(path, O_RDONLY);
    if (!strcmp(entry, "openat")) return openat(dirfd, path, O_RDONLY);
    if (!strcmp(entry, "openat64")) return openat64(dirfd, path, O_RDONLY);
    if (!strcmp(entry, "__open_2")) return __open_2(path, O_RDONLY);
    if (!strcmp(entry, "__open64_2")) return __open64_2(path, O_RDONLY);
    if (!strcmp(entry, "__openat_2")) return __openat_2(dirfd, path, O_RDONLY);
    if (!strcmp(entry, "__openat64_2")) return __openat64_2(dirfd, path, O_RDONLY);
    if (!strcmp(entry, "fopen")) *fp = fopen(path, "rb");
    else if (!strcmp(entry, "fopen64")) *fp = fopen64(path, "re");
    else if (!strcmp(entry, "freopen") || !strcmp(entry, "freopen64")) {
        FILE *f = fopen("/dev/null", "r");
        if (!f) return -1;
        *fp = !strcmp(entry, "freopen") ? freopen(path, "r", f) : freopen64(path, "r", f);
    } else {
        fprintf(stderr, "unknown entry %s\n", entry);
        exit(2);
    }
    return *fp ? fileno(*fp) : -1;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: shimtest ENTRY PATH OUT [DIR]\n");
        return 2;
    }
    int dirfd = AT_FDCWD;
    if (argc > 4 && (dirfd = open(argv[4], O_RDONLY | O_DIRECTORY)) < 0) {
        perror(argv[4]);
        return 2;
    }
    FILE *fp;
    int fd = open_with(argv[1], argv[2], dirfd, &fp);
    if (fd < 0) {
        printf("errno=%d\n", errno);
        return 1;
    }
    char link[64], target[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    FILE *out = fopen(argv[3], "wb");
    char buf[65536];
    for (;;) {
        ssize_t r = fp ? (ssize_t)fread(buf, 1, sizeof buf, fp) : read(fd, buf, sizeof buf);
        if (r <= 0) break;
        fwrite(buf, 1, (size_t)r, out);
    }
    fclose(out);
    if (fp) fclose(fp); else close(fd);
    printf("%s\n", target);
    return 0;
}
