/* p_bigtls_lib.c - a library with a 12 MiB thread-local buffer, loaded
 * with dlopen by p_release tlsjoin: glibc gives each thread its own block
 * with malloc at first use (dynamic TLS) and frees it from ld.so. */
__thread char big_tls[12 << 20];
__attribute__((visibility("default"))) void touch_tls(void);
void touch_tls(void)
{
    big_tls[0] = 1;
    big_tls[sizeof big_tls - 1] = 1;
}
