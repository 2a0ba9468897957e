/* device.h - the device side as the rest of the library sees it: stats for
 * reports and the fork hooks.  The CUDA entry points themselves are in
 * override_cuda.c. */
#ifndef FA_DEVICE_H
#define FA_DEVICE_H

struct fa_snapshot;

/* Fill the device part of a snapshot without taking locks (signal-safe). */
void fa_device_fill(struct fa_snapshot *s);
void fa_device_fork_prepare(void);
void fa_device_fork_parent(void);
void fa_device_fork_child(void);

#endif
