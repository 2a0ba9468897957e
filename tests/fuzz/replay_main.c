/* replay_main.c - runs a libFuzzer harness without libFuzzer: every file
 * named on the command line, and every regular file in every directory
 * named (in name order, so runs are reproducible), is passed once to
 * LLVMFuzzerTestOneInput.  This is how the committed corpus is replayed as
 * a ctest with any compiler.  Exits 1 when a path cannot be read or when
 * there was no input at all (an empty or missing corpus is an error). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static size_t replayed;

/* Read the whole file into a buffer of exactly its size (so a sanitizer
 * sees reads past the input) and run it. */
static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return 1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        perror(path);
        fclose(f);
        return 1;
    }
    size_t size = (size_t)st.st_size;
    uint8_t *data = malloc(size ? size : 1);
    if (!data || fread(data, 1, size, f) != size) {
        fprintf(stderr, "%s: read failed\n", path);
        free(data);
        fclose(f);
        return 1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(data, size);
    free(data);
    replayed++;
    return 0;
}

static int only_files(const struct dirent *e) { return e->d_name[0] != '.'; }

static int run_dir(const char *dir)
{
    struct dirent **names;
    int n = scandir(dir, &names, only_files, alphasort);
    if (n < 0) {
        perror(dir);
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(dir) + strlen(names[i]->d_name) + 2;
        char *path = malloc(len);
        if (!path) {
            rc = 1;
        } else {
            snprintf(path, len, "%s/%s", dir, names[i]->d_name);
            struct stat st;
            if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
                rc |= run_file(path);
            free(path);
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            rc = 1;
        } else if (S_ISDIR(st.st_mode)) {
            rc |= run_dir(argv[i]);
        } else {
            rc |= run_file(argv[i]);
        }
    }
    printf("replayed %zu inputs\n", replayed);
    if (replayed == 0) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...: no input found\n", argv[0]);
        return 1;
    }
    return rc;
}
