/* How many file positions the shim asks for when a forked child closes a
 * descriptor it inherited.  The shim is built into this program, whose own
 * syscall() counts the lseeks the shim makes: run it with TIERING_INDEX and
 * without LD_PRELOAD.
 *
 *   forkclose PATH   open PATH, read 100 bytes, fork: the child closes its
 *                    copy of the fd and exits with its count of lseeks; the
 *                    parent reads 100 more and closes it
 *
 * Prints the lseeks of the child's close and of the parent's.
 */
#include "../../shim/tiershim.c"

#include <stdarg.h>
#include <sys/wait.h>

static int lseeks;

long syscall(long n, ...)
{
    static long (*next)(long, ...);
    va_list ap;
    long a[6];
    va_start(ap, n);
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    if (!next)
        next = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    lseeks += n == SYS_lseek;
    return next(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}

int main(int argc, char **argv)
{
    char b[100];
    if (argc < 2)
        return 2;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0 || read(fd, b, sizeof b) != (ssize_t)sizeof b)
        return 1;
    pid_t pid = fork();
    if (pid == 0) {
        int before = lseeks;
        close(fd);
        _exit(lseeks - before);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return 1;
    if (read(fd, b, sizeof b) != (ssize_t)sizeof b)
        return 1;
    int before = lseeks;
    close(fd);
    printf("%d %d\n", WEXITSTATUS(status), lseeks - before);
    return 0;
}
