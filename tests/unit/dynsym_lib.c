/* dynsym_lib.c - a library for test_dynsym, built once with a GNU hash
 * table and once with a SysV one (dynsym_lib.map gives the versions): a
 * plain function, one at two versions, one only at an old (hidden)
 * version, an indirect function, data, and a local function. */
#define EXPORT __attribute__((visibility("default")))

EXPORT int dynsym_plain(void) { return 1; }

EXPORT int dynsym_v1(void) { return 11; }
EXPORT int dynsym_v2(void) { return 12; }
EXPORT int dynsym_old_impl(void) { return 21; }
__asm__(".symver dynsym_v1, dynsym_versioned@DYNSYM_1");
__asm__(".symver dynsym_v2, dynsym_versioned@@DYNSYM_2");
__asm__(".symver dynsym_old_impl, dynsym_old@DYNSYM_1");

static int ifunc_impl(void) { return 31; }
static int (*ifunc_resolve(void))(void) { return ifunc_impl; }
EXPORT int dynsym_ifunc(void) __attribute__((ifunc("ifunc_resolve")));

EXPORT int dynsym_data = 41;

int dynsym_local(void) { return 51; }
