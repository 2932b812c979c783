/* Asks every stat and access entry point of libc about one path:
 *   statall PATH
 * prints one line per call: its name, then every field of the answer (or
 * errno=N), then errno after the call (set to 4242 before it: a call that
 * succeeds leaves errno alone).  The *at forms run relative to AT_FDCWD and
 * to a descriptor of PATH's directory; the descriptor forms run on PATH
 * opened read-only.  statx prints the fields of its mask only. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int __xstat(int, const char *, struct stat *);
int __xstat64(int, const char *, struct stat64 *);
int __lxstat(int, const char *, struct stat *);
int __lxstat64(int, const char *, struct stat64 *);
int __fxstat(int, int, struct stat *);
int __fxstat64(int, int, struct stat64 *);
int __fxstatat(int, int, const char *, struct stat *, int);
int __fxstatat64(int, int, const char *, struct stat64 *, int);

#define VER 1 /* _STAT_VER on x86_64 */

static void show(const char *call, int r, const struct stat *st)
{
    int e = errno;
    if (r != 0) {
        printf("%s errno=%d\n", call, e);
        return;
    }
    printf("%s dev=%llu ino=%llu nlink=%llu mode=%o uid=%u gid=%u rdev=%llu size=%lld blksize=%ld "
           "blocks=%lld atime=%lld.%09ld mtime=%lld.%09ld ctime=%lld.%09ld errno=%d\n",
           call, (unsigned long long)st->st_dev, (unsigned long long)st->st_ino,
           (unsigned long long)st->st_nlink, st->st_mode, st->st_uid, st->st_gid,
           (unsigned long long)st->st_rdev, (long long)st->st_size, (long)st->st_blksize,
           (long long)st->st_blocks, (long long)st->st_atim.tv_sec, st->st_atim.tv_nsec,
           (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec, (long long)st->st_ctim.tv_sec,
           st->st_ctim.tv_nsec, e);
}

static void show_statx(const char *call, unsigned int mask, int r, const struct statx *sx)
{
    int e = errno;
    if (r != 0) {
        printf("%s errno=%d\n", call, e);
        return;
    }
    unsigned int m = sx->stx_mask & mask;
    printf("%s mask=%x", call, m);
    if (m & STATX_TYPE)
        printf(" type=%o", sx->stx_mode & S_IFMT);
    if (m & STATX_MODE)
        printf(" mode=%o", sx->stx_mode & ~S_IFMT);
    if (m & STATX_NLINK)
        printf(" nlink=%u", sx->stx_nlink);
    if (m & STATX_UID)
        printf(" uid=%u", sx->stx_uid);
    if (m & STATX_GID)
        printf(" gid=%u", sx->stx_gid);
    if (m & STATX_INO)
        printf(" ino=%llu", (unsigned long long)sx->stx_ino);
    if (m & STATX_SIZE)
        printf(" size=%llu", (unsigned long long)sx->stx_size);
    if (m & STATX_BLOCKS)
        printf(" blocks=%llu", (unsigned long long)sx->stx_blocks);
    if (m & STATX_ATIME)
        printf(" atime=%lld.%09u", (long long)sx->stx_atime.tv_sec, sx->stx_atime.tv_nsec);
    if (m & STATX_MTIME)
        printf(" mtime=%lld.%09u", (long long)sx->stx_mtime.tv_sec, sx->stx_mtime.tv_nsec);
    if (m & STATX_CTIME)
        printf(" ctime=%lld.%09u", (long long)sx->stx_ctime.tv_sec, sx->stx_ctime.tv_nsec);
    if (m & STATX_BTIME)
        printf(" btime=%lld.%09u", (long long)sx->stx_btime.tv_sec, sx->stx_btime.tv_nsec);
    printf(" blksize=%u dev=%u:%u errno=%d\n", sx->stx_blksize, sx->stx_dev_major, sx->stx_dev_minor, e);
}

static void show_access(const char *call, int r)
{
    printf("%s %s errno=%d\n", call, r == 0 ? "ok" : "fail", errno);
}

#define STAT(call, expr)                 \
    do {                                 \
        struct stat st_;                 \
        memset(&st_, 0xa5, sizeof st_);  \
        errno = 4242;                    \
        int r_ = expr;                   \
        show(call, r_, &st_);            \
    } while (0)

#define STATX(call, mask, expr)                  \
    do {                                         \
        struct statx sx_;                        \
        memset(&sx_, 0xa5, sizeof sx_);          \
        errno = 4242;                            \
        int r_ = expr;                           \
        show_statx(call, mask, r_, &sx_);        \
    } while (0)

#define ACCESS(call, expr)        \
    do {                          \
        errno = 4242;             \
        show_access(call, expr);  \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: statall PATH\n");
        return 2;
    }
    const char *path = argv[1];
    char d[4096], b[4096];
    snprintf(d, sizeof d, "%s", path);
    snprintf(b, sizeof b, "%s", path);
    const char *name = basename(b);
    int dirfd = open(dirname(d), O_RDONLY | O_DIRECTORY);
    if (dirfd < 0) {
        perror("open directory");
        return 2;
    }
    STAT("stat", stat(path, &st_));
    STAT("stat64", stat64(path, (struct stat64 *)&st_));
    STAT("lstat", lstat(path, &st_));
    STAT("lstat64", lstat64(path, (struct stat64 *)&st_));
    STAT("fstatat", fstatat(AT_FDCWD, path, &st_, 0));
    STAT("fstatat-nofollow", fstatat(AT_FDCWD, path, &st_, AT_SYMLINK_NOFOLLOW));
    STAT("fstatat-dirfd", fstatat(dirfd, name, &st_, 0));
    STAT("fstatat64-dirfd-nofollow", fstatat64(dirfd, name, (struct stat64 *)&st_, AT_SYMLINK_NOFOLLOW));
    STAT("fstatat-empty-path-flag", fstatat(AT_FDCWD, path, &st_, AT_EMPTY_PATH));
    STAT("__xstat", __xstat(VER, path, &st_));
    STAT("__xstat64", __xstat64(VER, path, (struct stat64 *)&st_));
    STAT("__lxstat", __lxstat(VER, path, &st_));
    STAT("__lxstat64", __lxstat64(VER, path, (struct stat64 *)&st_));
    STAT("__fxstatat", __fxstatat(VER, AT_FDCWD, path, &st_, 0));
    STAT("__fxstatat64-dirfd-nofollow", __fxstatat64(VER, dirfd, name, (struct stat64 *)&st_, AT_SYMLINK_NOFOLLOW));
    STATX("statx-basic", STATX_BASIC_STATS, statx(AT_FDCWD, path, 0, STATX_BASIC_STATS, &sx_));
    STATX("statx-some", STATX_SIZE | STATX_MTIME,
          statx(AT_FDCWD, path, AT_STATX_DONT_SYNC, STATX_SIZE | STATX_MTIME, &sx_));
    STATX("statx-dirfd-nofollow", STATX_BASIC_STATS,
          statx(dirfd, name, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx_));
    STATX("statx-btime", STATX_BASIC_STATS | STATX_BTIME,
          statx(AT_FDCWD, path, 0, STATX_BASIC_STATS | STATX_BTIME, &sx_));
    STATX("statx-force-sync", STATX_BASIC_STATS, statx(AT_FDCWD, path, AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &sx_));
    ACCESS("access-F_OK", access(path, F_OK));
    ACCESS("access-R_OK", access(path, R_OK));
    ACCESS("faccessat-F_OK", faccessat(dirfd, name, F_OK, 0));
    ACCESS("faccessat-F_OK-eaccess", faccessat(AT_FDCWD, path, F_OK, AT_EACCESS));
    ACCESS("faccessat-F_OK-nofollow", faccessat(AT_FDCWD, path, F_OK, AT_SYMLINK_NOFOLLOW));
    ACCESS("euidaccess-F_OK", euidaccess(path, F_OK));
    ACCESS("eaccess-F_OK", eaccess(path, F_OK));
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        printf("open errno=%d\n", errno);
        return 0;
    }
    STAT("fstat", fstat(fd, &st_));
    STAT("fstat64", fstat64(fd, (struct stat64 *)&st_));
    STAT("__fxstat", __fxstat(VER, fd, &st_));
    STAT("__fxstat64", __fxstat64(VER, fd, (struct stat64 *)&st_));
    STAT("fstatat-empty-path", fstatat(fd, "", &st_, AT_EMPTY_PATH));
    STAT("__fxstatat-empty-path", __fxstatat(VER, fd, "", &st_, AT_EMPTY_PATH));
    STATX("statx-empty-path", STATX_BASIC_STATS, statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &sx_));
    close(fd);
    return 0;
}
