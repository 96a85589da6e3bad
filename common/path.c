/* path.c: joining and splitting paths. */
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "path.h"

int tp_path_join(char *out, const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    if (a + 1 + b + 1 > TP_PATH_MAX)
        return tp_fail(TP_ERR_ARG, "path %s/%s is longer than %d bytes", dir, name, TP_PATH_MAX);
    memcpy(out, dir, a);
    out[a] = '/';
    memcpy(out + a + 1, name, b + 1);
    return TP_OK;
}

int tp_split_path(const char *path, char *parent, size_t parent_size, char *base, size_t base_size)
{
    char copy[TP_PATH_MAX];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof copy) return tp_fail(TP_ERR_ARG, "path '%s' is empty or too long", path);
    memcpy(copy, path, n + 1);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = '\0';
    char *slash = strrchr(copy, '/');
    const char *dir = ".", *name = copy;
    if (slash == copy) {
        dir = "/";
        name = copy + 1;
    } else if (slash) {
        *slash = '\0';
        dir = copy;
        name = slash + 1;
    }
    if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return tp_fail(TP_ERR_ARG, "path '%s' does not name a directory entry", path);
    if (snprintf(parent, parent_size, "%s", dir) >= (int)parent_size ||
        snprintf(base, base_size, "%s", name) >= (int)base_size)
        return tp_fail(TP_ERR_ARG, "path '%s' is too long", path);
    return TP_OK;
}
