/* A program with the bug each sanitizer must report, for the test that a
 * sanitized run fails on a report (tests/test_sanitizers.py):
 *
 *   sanfail overflow   a forked child reads one byte past a heap buffer
 *                      (AddressSanitizer); the parent exits 0 whatever the
 *                      child did: only the report on stderr tells
 *   sanfail shift      shifts an int by a count that is not below its width
 *                      (UBSan)
 *   sanfail race       two threads add to one plain counter (ThreadSanitizer)
 *
 * Prints "ok" when it gets to the end. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static long counter;
static volatile int width = 32;

static void *add(void *arg)
{
    for (int i = 0; i < 100000; i++)
        counter++;
    return arg;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (!strcmp(argv[1], "overflow")) {
        pid_t pid = fork();
        if (pid == 0) {
            volatile char *p = malloc(16);
            _exit(p[16] == 'x');
        }
        waitpid(pid, NULL, 0);
    } else if (!strcmp(argv[1], "shift")) {
        printf("%d\n", 1 << width);
    } else if (!strcmp(argv[1], "race")) {
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, add, NULL);
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], NULL);
    } else {
        return 2;
    }
    printf("ok\n");
    return 0;
}
