/* Formats an rcutils log record (`format` + the `va_list *` an rcutils output handler
 * receives) into `buf`, for src/ros/node/rosout.rs. In C because a va_list is an
 * architecture-specific object (an array of one struct on x86-64, a struct passed by
 * value on aarch64) that stable Rust cannot copy portably; va_copy can, so `*args` stays
 * untouched for the next handler (rcl's console and log-file output). */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* Returns what vsnprintf returns: the length of the whole message (it was cut if that is
 * >= cap), or a negative value on an encoding error. */
int vision_preproc_vformat(char *buf, size_t cap, const char *format, va_list *args)
{
    va_list copy;
    va_copy(copy, *args);
    int n = vsnprintf(buf, cap, format, copy);
    va_end(copy);
    return n;
}
