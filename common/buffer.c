/* buffer.c: see buffer.h. */
#include "buffer.h"

#include <stdlib.h>
#include <string.h>

void buffer_put(byte_buffer *b, const void *data, size_t n)
{
    if (b->failed) return;
    if (b->size + n + 1 > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 256;
        while (capacity < b->size + n + 1) capacity *= 2;
        char *grown = realloc(b->data, capacity);
        if (!grown) {
            b->failed = 1;
            return;
        }
        b->data = grown;
        b->capacity = capacity;
    }
    memcpy(b->data + b->size, data, n);
    b->size += n;
    b->data[b->size] = '\0';
}

void buffer_put_text(byte_buffer *b, const char *text)
{
    buffer_put(b, text, strlen(text));
}
