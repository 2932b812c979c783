/* What publishing a copy costs a file system, per small file: the same copy
 * (open a source in the page cache, sendfile, close) made visible four ways.
 *
 *   publish MODE ROOT FILES PER SOURCE
 *
 * MODE: create   the final name made directly (O_CREAT|O_EXCL), as cp -r does
 *       staging  a name in a staging directory, renamed into the destination
 *                directory once complete (what tiering does, NOTE [batch copy])
 *       samedir  a temporary name in the destination directory, renamed
 *       tmpfile  an unnamed O_TMPFILE in the destination directory, linked
 *                under its name once complete (linkat through /proc/self/fd)
 * Makes FILES files under ROOT (which must not exist), PER a directory, and
 * prints one JSON line: the mode, the files, the seconds of the loop and of a
 * syncfs after it.  Exits 1 on the first error, saying which call failed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* the same copy in every mode: the source opened, its bytes sent, closed */
static void fill(int out, const char *source, off_t size)
{
    int in = open(source, O_RDONLY);
    if (in < 0)
        die("open source");
    off_t off = 0;
    while (off < size) {
        ssize_t n = sendfile(out, in, &off, (size_t)(size - off));
        if (n < 0)
            die("sendfile");
        if (n == 0) {
            fprintf(stderr, "sendfile: the source ended early\n");
            exit(1);
        }
    }
    close(in);
}

/* a positive int, or -1 */
static int positive(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || end == s || *end || v < 1 || v > 1000000000 ? -1 : (int)v;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: publish create|staging|samedir|tmpfile ROOT FILES PER SOURCE\n");
        return 2;
    }
    const char *mode = argv[1], *root = argv[2], *source = argv[5];
    if (strcmp(mode, "create") && strcmp(mode, "staging") && strcmp(mode, "samedir") && strcmp(mode, "tmpfile")) {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    int files = positive(argv[3]), per = positive(argv[4]);
    if (files < 0 || per < 0) {
        fprintf(stderr, "FILES and PER must be whole numbers from 1 to 1000000000\n");
        return 2;
    }
    int dirs = files / per + (files % per != 0);
    struct stat st;
    if (stat(source, &st) < 0)
        die("stat source");
    if (mkdir(root, 0700) < 0)
        die("mkdir root");
    int rfd = open(root, O_RDONLY | O_DIRECTORY);
    if (rfd < 0 || mkdirat(rfd, "staging", 0700) < 0)
        die("staging directory");
    int sfd = openat(rfd, "staging", O_RDONLY | O_DIRECTORY);
    if (sfd < 0)
        die("open staging");
    char name[64], tmp[64], proc[64];
    double t0 = now();
    for (int d = 0; d < dirs; d++) {
        snprintf(name, sizeof name, "d%05d", d);
        if (mkdirat(rfd, name, 0700) < 0)
            die("mkdirat");
        int dfd = openat(rfd, name, O_RDONLY | O_DIRECTORY);
        if (dfd < 0)
            die("open directory");
        int here = files - d * per < per ? files - d * per : per;
        for (int i = 0; i < here; i++) {
            snprintf(name, sizeof name, "f%07d", i);
            snprintf(tmp, sizeof tmp, ".part-%d", i);
            int fd;
            if (!strcmp(mode, "create")) {
                if ((fd = openat(dfd, name, O_CREAT | O_EXCL | O_WRONLY, 0400)) < 0)
                    die("create");
                fill(fd, source, st.st_size);
                close(fd);
            } else if (!strcmp(mode, "staging") || !strcmp(mode, "samedir")) {
                int at = strcmp(mode, "staging") ? dfd : sfd;
                if ((fd = openat(at, tmp, O_CREAT | O_EXCL | O_WRONLY, 0400)) < 0)
                    die("create temporary");
                fill(fd, source, st.st_size);
                close(fd);
                if (renameat(at, tmp, dfd, name) < 0)
                    die("renameat");
            } else {
                if ((fd = openat(dfd, ".", O_TMPFILE | O_WRONLY, 0400)) < 0)
                    die("O_TMPFILE");
                fill(fd, source, st.st_size);
                snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
                if (linkat(AT_FDCWD, proc, dfd, name, AT_SYMLINK_FOLLOW) < 0)
                    die("linkat");
                close(fd);
            }
        }
        close(dfd);
    }
    double t1 = now();
    if (syncfs(rfd) < 0)
        die("syncfs");
    double t2 = now();
    printf("{\"mode\": \"%s\", \"files\": %d, \"seconds\": %.6f, \"sync_seconds\": %.6f}\n",
           mode, files, t1 - t0, t2 - t1);
    return 0;
}
