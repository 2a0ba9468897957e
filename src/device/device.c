/* device.c - placeholder until the device pool lands. */
#include "device.h"

void fa_device_fill(struct fa_snapshot *s) { (void)s; }
void fa_device_fork_prepare(void) {}
void fa_device_fork_parent(void) {}
void fa_device_fork_child(void) {}
