/* buffer.h: a growing byte buffer for building headers and texts. A failed
 * growth marks it failed and later appends do nothing, so that a builder
 * checks once, at the end. */
#ifndef TP_BUFFER_H
#define TP_BUFFER_H

#include <stddef.h>

typedef struct {
    char *data; /* NUL-terminated after every append (the NUL not counted in size); free() releases it */
    size_t size, capacity;
    int failed;
} byte_buffer;

void buffer_put(byte_buffer *b, const void *data, size_t n);
void buffer_put_text(byte_buffer *b, const char *text);

#endif
