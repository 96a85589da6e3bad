/* namemap.h: tensor name -> index lookup over an array the caller owns. */
#ifndef TP_CKPT_NAMEMAP_H
#define TP_CKPT_NAMEMAP_H

#include "internal.h"

typedef const char *(*ckpt_name_of)(const void *ctx, int64_t index);

typedef struct {
    int64_t *slots; /* index + 1, 0 = empty */
    uint64_t mask;
    int64_t count;
} ckpt_name_map;

/* Inserting a name already present fails with TP_ERR_ARG. */
int ckpt_name_map_insert(ckpt_name_map *map, const char *name, int64_t index, ckpt_name_of name_of,
                         const void *ctx);
int64_t ckpt_name_map_find(const ckpt_name_map *map, const char *name, ckpt_name_of name_of,
                           const void *ctx); /* -1 when absent */
void ckpt_name_map_free(ckpt_name_map *map);

#endif
