/* testutil.h - helpers shared by the cmocka unit tests. */
#ifndef FA_TESTUTIL_H
#define FA_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>

/* Redirect fd 2 into a temporary file until _end copies it into out. */
void fa_capture_stderr_begin(void);
void fa_capture_stderr_end(char *out, size_t cap);
int fa_count_lines(const char *s);
/* True when python3's json module accepts the text (FA_TEST_PYTHON). */
bool fa_json_valid(const char *text);
/* Run python3 with `code` (reads the text on stdin); true on exit 0. */
bool fa_python_check(const char *code, const char *text);
/* n fresh pages of private anonymous memory; aborts if mmap fails. */
unsigned char *fa_map_pages(size_t n);
/* Whether the page that holds p is resident (mincore); aborts on error. */
bool fa_page_resident(const void *p);
/* Remove a test's temporary directory and all it holds; 0 on success. */
int fa_remove_tree(const char *dir);

#endif
