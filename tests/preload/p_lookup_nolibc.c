/* p_lookup_nolibc.c - a library with no dependencies at all (linked with
 * -nostdlib): a lookup through its handle reaches no libc, so even
 * malloc is not found there (p_lookup libc). */
int lookup_nolibc(void) { return 1; }
