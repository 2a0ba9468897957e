/* testutil.c - helpers shared by the cmocka unit tests. */
#define _GNU_SOURCE
#include "testutil.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static int saved_fd = -1;
static FILE *capture;

void fa_capture_stderr_begin(void)
{
    capture = tmpfile();
    saved_fd = dup(2);
    dup2(fileno(capture), 2);
}

void fa_capture_stderr_end(char *out, size_t cap)
{
    dup2(saved_fd, 2);
    close(saved_fd);
    rewind(capture);
    size_t n = fread(out, 1, cap - 1, capture);
    out[n] = '\0';
    fclose(capture);
}

int fa_count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

bool fa_python_check(const char *code, const char *text)
{
    FILE *in = tmpfile();
    if (!in)
        return false;
    fputs(text, in);
    fflush(in);
    rewind(in);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fileno(in), 0);
        execl(FA_TEST_PYTHON, FA_TEST_PYTHON, "-c", code, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    fclose(in);
    return pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

bool fa_json_valid(const char *text) { return fa_python_check("import json,sys; json.load(sys.stdin)", text); }

unsigned char *fa_map_pages(size_t n)
{
    void *p = mmap(NULL, n * (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        abort();
    return p;
}

bool fa_page_resident(const void *p)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char v = 0;
    if (mincore((void *)((uintptr_t)p & ~(uintptr_t)(page - 1)), page, &v) != 0)
        abort();
    return v & 1;
}

int fa_remove_tree(const char *dir)
{
    char cmd[1100];
    if ((size_t)snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", dir) >= sizeof cmd || strchr(dir, '\''))
        return -1;
    return system(cmd);
}
