/* The shim's wrappers when dlsym found none of libc's functions (the library
 * is compiled into this program and its table of real functions is cleared):
 * each one still works through the raw system call, or fails with ENOSYS
 * where only libc can do the job (stdio, directory streams, credentials,
 * which a system call would change for one thread only).  Prints "ok". */
#pragma GCC diagnostic ignored "-Wnonnull-compare"
#include "../../shim/tiershim.c"


#define CHECK(cond)                                                 \
    do {                                                            \
        if (!(cond)) {                                              \
            printf("failed: %s (errno %d)\n", #cond, errno);      \
            return 1;                                               \
        }                                                           \
    } while (0)

int main(void)
{
    memset(&real, 0, sizeof real);
    int fd = open("/dev/null", O_RDONLY);
    CHECK(fd >= 0);
    int fd2 = openat(AT_FDCWD, "/dev/null", O_RDONLY);
    CHECK(fd2 >= 0);
    int a = dup(fd);
    CHECK(a >= 0 && a != fd);
    CHECK(dup2(fd, 40) == 40);
    CHECK(dup2(40, 40) == 40);
    CHECK(dup3(fd, 41, O_CLOEXEC) == 41);
    CHECK(fcntl(41, F_GETFD) == FD_CLOEXEC);
    CHECK(fcntl(fd, F_DUPFD, 50) >= 50);
    CHECK(fcntl64(fd, F_DUPFD_CLOEXEC, 60) >= 60);
    CHECK(close(a) == 0 && close(40) == 0 && close(41) == 0);
    CHECK(close_range(50, 70, 0) == 0);
    CHECK(fcntl(50, F_GETFD) == -1 && errno == EBADF);
    errno = 0;
    CHECK(fopen("/dev/null", "r") == NULL && errno == ENOSYS);
    FILE *f = fdopen(fd2, "r");
    CHECK(f != NULL);
    errno = 0;
    CHECK(fclose(f) == EOF && errno == ENOSYS);
    DIR *d = opendir("/");
    CHECK(d != NULL);
    errno = 0;
    CHECK(closedir(d) == -1 && errno == ENOSYS);
    struct stat st;
    struct statx sx;
    CHECK(stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
    CHECK(lstat64("/dev/null", (struct stat64 *)&st) == 0 && S_ISCHR(st.st_mode));
    CHECK(fstat(fd, &st) == 0 && S_ISCHR(st.st_mode));
    CHECK(fstatat(AT_FDCWD, "/dev/null", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISCHR(st.st_mode));
    CHECK(__xstat(STAT_VER, "/dev/null", &st) == 0 && S_ISCHR(st.st_mode));
    CHECK(__fxstat64(STAT_VER, fd, (struct stat64 *)&st) == 0 && S_ISCHR(st.st_mode));
    errno = 0;
    CHECK(__xstat(STAT_VER + 7, "/dev/null", &st) == -1 && errno == EINVAL);
    CHECK(statx(AT_FDCWD, "/dev/null", 0, STATX_BASIC_STATS, &sx) == 0 && S_ISCHR(sx.stx_mode));
    CHECK(access("/dev/null", R_OK) == 0);
    CHECK(faccessat(AT_FDCWD, "/dev/null", F_OK, AT_EACCESS) == 0);
    CHECK(euidaccess("/dev/null", F_OK) == 0 && eaccess("/dev/null", F_OK) == 0);
    errno = 0;
    CHECK(access("/nonexistent/x", F_OK) == -1 && errno == ENOENT);
    errno = 0;
    CHECK(setuid(getuid()) == -1 && errno == ENOSYS);
    char dir[] = "/tmp/unresolved-XXXXXX", a_[64], b_[64], c_[64];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(a_, sizeof a_, "%s/a", dir);
    snprintf(b_, sizeof b_, "%s/b", dir);
    snprintf(c_, sizeof c_, "%s/c", dir);
    int w = open(a_, O_WRONLY | O_CREAT, 0600);
    CHECK(w >= 0 && write(w, "12345", 5) == 5 && close(w) == 0);
    CHECK(rename(a_, b_) == 0 && renameat(AT_FDCWD, b_, AT_FDCWD, c_) == 0);
    CHECK(renameat2(AT_FDCWD, c_, AT_FDCWD, a_, RENAME_NOREPLACE) == 0);
    CHECK(truncate(a_, 3) == 0 && stat(a_, &st) == 0 && st.st_size == 3);
    CHECK(truncate64(a_, 1) == 0 && stat(a_, &st) == 0 && st.st_size == 1);
    CHECK(chmod(a_, 0644) == 0 && stat(a_, &st) == 0 && (st.st_mode & 0777) == 0644);
    CHECK(chown(a_, 0, 0) == 0 && lchown(a_, 0, 0) == 0);
    w = open(a_, O_RDONLY);
    CHECK(w >= 0 && fchmod(w, 0600) == 0 && stat(a_, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK(fchown(w, 0, 0) == 0 && futimens(w, NULL) == 0 && utimensat(AT_FDCWD, a_, NULL, 0) == 0);
    CHECK(flock(w, LOCK_SH) == 0 && flock(w, LOCK_UN) == 0);
    struct statfs sfs;
    CHECK(fstatfs(w, &sfs) == 0);
    errno = 0;
    CHECK(lockf(w, F_TEST, 0) == -1 && errno == ENOSYS);
    errno = 0;
    CHECK(utime(a_, NULL) == -1 && errno == ENOSYS);
    CHECK(close(w) == 0);
    CHECK(link(a_, b_) == 0 && linkat(AT_FDCWD, b_, AT_FDCWD, c_, 0) == 0 && unlink(b_) == 0 && unlink(c_) == 0);
    CHECK(unlink(a_) == 0 && access(a_, F_OK) == -1);
    CHECK(mkdir(a_, 0700) == 0 && remove(a_) == 0 && access(a_, F_OK) == -1);
    CHECK(close(open(a_, O_WRONLY | O_CREAT, 0600)) == 0 && remove(a_) == 0 && access(a_, F_OK) == -1);
    CHECK(unlinkat(AT_FDCWD, dir, AT_REMOVEDIR) == 0);
    CHECK(close(fd) == 0);
    printf("ok\n");
    return 0;
}
