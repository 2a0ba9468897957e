/* tcprop.h - one of tcmalloc's numeric properties ("tcmalloc.*",
 * "generic.*"); 0 when this tcmalloc does not know it. */
#ifndef FA_TCPROP_H
#define FA_TCPROP_H

#include <gperftools/malloc_extension_c.h>
#include <stddef.h>

static inline size_t fa_tc_prop(const char *name)
{
    size_t v = 0;
    MallocExtension_GetNumericProperty(name, &v);
    return v;
}

#endif
