/* export.h - FA_EXPORT marks the names the library defines for the
 * program to call instead of libc's, libstdc++'s and the CUDA runtime's
 * (the override files); everything else is built with hidden visibility.
 * The public API's own marker is FA_API in include/forgealloc.h. */
#ifndef FA_EXPORT_H
#define FA_EXPORT_H

#define FA_EXPORT __attribute__((visibility("default")))

#endif
