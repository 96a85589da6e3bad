/* namemap.c: tensor name -> index lookup (open addressing on XXH3 of the name). */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "namemap.h"

void ckpt_name_map_free(ckpt_name_map *map)
{
    free(map->slots);
    memset(map, 0, sizeof *map);
}

static int64_t *find_slot(int64_t *slots, uint64_t mask, const char *name, ckpt_name_of name_of,
                          const void *ctx)
{
    uint64_t i = XXH3_64bits(name, strlen(name)) & mask;
    while (slots[i] != 0 && strcmp(name_of(ctx, slots[i] - 1), name) != 0) i = (i + 1) & mask;
    return &slots[i];
}

int64_t ckpt_name_map_find(const ckpt_name_map *map, const char *name, ckpt_name_of name_of,
                           const void *ctx)
{
    if (!map->slots) return -1;
    int64_t slot = *find_slot(map->slots, map->mask, name, name_of, ctx);
    return slot - 1;
}

int ckpt_name_map_insert(ckpt_name_map *map, const char *name, int64_t index, ckpt_name_of name_of,
                         const void *ctx)
{
    if (2 * (map->count + 1) > (int64_t)(map->mask + 1) || !map->slots) {
        uint64_t capacity = map->slots ? 2 * (map->mask + 1) : 64;
        int64_t *slots = calloc(capacity, sizeof *slots);
        if (!slots) return tp_fail(TP_ERR_NOMEM, "out of memory for the tensor table");
        for (uint64_t i = 0; map->slots && i <= map->mask; i++)
            if (map->slots[i])
                *find_slot(slots, capacity - 1, name_of(ctx, map->slots[i] - 1), name_of, ctx) =
                    map->slots[i];
        free(map->slots);
        map->slots = slots;
        map->mask = capacity - 1;
    }
    int64_t *slot = find_slot(map->slots, map->mask, name, name_of, ctx);
    if (*slot) return tp_fail(TP_ERR_ARG, "tensor %s is declared twice", name);
    *slot = index + 1;
    map->count++;
    return TP_OK;
}
