/* libraries.c: finding the CUDA libraries and their functions (libraries.h). */
#include "libraries.h"

#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../common/buffer.h"
#include "../../common/error.h"

/* The toolkit the build used (the Makefile passes it); none when built
 * without one. */
#ifndef TP_CUDA_HOME
#define TP_CUDA_HOME ""
#endif

/* One search: where has been looked (for the message), the first copy that
 * was found but would not load (for the message too), and what was loaded. */
typedef struct {
    const char *const *names;
    size_t name_count;
    byte_buffer looked;
    char refused[1024];
    void *library;
    char found_in[PATH_MAX];
} search;

static void note_looked(search *s, const char *place)
{
    if (s->looked.size) buffer_put_text(&s->looked, ", ");
    buffer_put_text(&s->looked, place);
}

/* Tries DIR/NAME for each name; 1 when one loaded. A copy that exists but
 * does not load is remembered, and the search goes on. */
static int try_directory(search *s, const char *dir)
{
    for (size_t i = 0; i < s->name_count; i++) {
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, s->names[i]) >= (int)sizeof path) continue;
        if (access(path, F_OK) != 0) continue;
        void *library = dlopen(path, RTLD_NOW);
        if (library) {
            s->library = library;
            snprintf(s->found_in, sizeof s->found_in, "%s", dir);
            return 1;
        }
        if (!s->refused[0]) snprintf(s->refused, sizeof s->refused, "%s", dlerror());
    }
    return 0;
}

/* Tries each directory once (PATH may name one twice) and notes it. */
static int try_directories(search *s, char **dirs, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        int seen = 0;
        for (size_t j = 0; j < i; j++) seen |= strcmp(dirs[i], dirs[j]) == 0;
        if (seen) continue;
        if (try_directory(s, dirs[i])) return 1;
    }
    return 0;
}

/* 1. The toolkit: its lib64 under the homes named in the environment and
 * the build's, then whatever the loader finds by itself. */
static int try_toolkit(search *s)
{
    const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), TP_CUDA_HOME};
    char dirs[3][PATH_MAX], *list[3];
    size_t count = 0;
    for (size_t i = 0; i < 3; i++) {
        if (!homes[i] || !homes[i][0]) continue;
        if (snprintf(dirs[count], PATH_MAX, "%s/lib64", homes[i]) >= PATH_MAX) continue;
        list[count] = dirs[count];
        note_looked(s, dirs[count]);
        count++;
    }
    if (try_directories(s, list, count)) return 1;
    note_looked(s, "the loader's path (LD_LIBRARY_PATH, ld.so.cache)");
    for (size_t i = 0; i < s->name_count; i++) {
        void *library = dlopen(s->names[i], RTLD_NOW);
        if (library) {
            s->library = library;
            if (dlinfo(library, RTLD_DI_ORIGIN, s->found_in) != 0) snprintf(s->found_in, sizeof s->found_in, "%s",
                                                                             "the loader's path");
            return 1;
        }
        const char *why = dlerror();
        /* "cannot open shared object file" is the usual absence; anything
         * else means a copy was found and refused. */
        if (why && !strstr(why, "cannot open shared object file") && !s->refused[0])
            snprintf(s->refused, sizeof s->refused, "%s", why);
    }
    return 0;
}

/* 2. PyTorch's wheels: PREFIX/lib/python3.X/{site,dist}-packages/nvidia/STAR/lib. */
static int try_python_prefix(search *s, const char *prefix)
{
    static const char *const patterns[] = {"%s/lib/python3*/site-packages/nvidia/*/lib",
                                           "%s/lib/python3*/dist-packages/nvidia/*/lib"};
    for (size_t p = 0; p < 2; p++) {
        char pattern[PATH_MAX];
        if (snprintf(pattern, sizeof pattern, patterns[p], prefix) >= (int)sizeof pattern) continue;
        if (p == 0) note_looked(s, pattern);
        glob_t found;
        if (glob(pattern, GLOB_ONLYDIR, NULL, &found) != 0) continue;
        int loaded = try_directories(s, found.gl_pathv, found.gl_pathc);
        globfree(&found);
        if (loaded) return 1;
    }
    return 0;
}

static int try_python(search *s)
{
    const char *envs[] = {getenv("VIRTUAL_ENV"), getenv("CONDA_PREFIX")};
    for (size_t i = 0; i < 2; i++)
        if (envs[i] && envs[i][0] && try_python_prefix(s, envs[i])) return 1;
    const char *path = getenv("PATH");
    if (!path) return 0;
    char *copy = strdup(path), *save = NULL;
    if (!copy) return 0;
    int loaded = 0;
    for (char *entry = strtok_r(copy, ":", &save); entry && !loaded; entry = strtok_r(NULL, ":", &save)) {
        char python[PATH_MAX];
        if (snprintf(python, sizeof python, "%s/python3", entry) >= (int)sizeof python) continue;
        if (access(python, X_OK) != 0) continue;
        /* The prefix of ENTRY/python3 is ENTRY's parent (a virtual
         * environment's bin/ is a folder of links into the system's). */
        char *slash = strrchr(entry, '/');
        if (!slash) continue;
        if (slash == entry) slash[1] = '\0';
        else *slash = '\0';
        loaded = try_python_prefix(s, entry);
    }
    free(copy);
    return loaded;
}

/* 3. TP_CUDA_LIBRARY_PATH. */
static int try_environment(search *s)
{
    const char *path = getenv("TP_CUDA_LIBRARY_PATH");
    if (!path || !path[0]) {
        note_looked(s, "TP_CUDA_LIBRARY_PATH (not set)");
        return 0;
    }
    char *copy = strdup(path), *save = NULL;
    if (!copy) return 0;
    int loaded = 0;
    for (char *dir = strtok_r(copy, ":", &save); dir && !loaded; dir = strtok_r(NULL, ":", &save)) {
        note_looked(s, dir);
        loaded = try_directory(s, dir);
    }
    free(copy);
    return loaded;
}

int cuda_library_open(const char *what, const char *const *names, size_t name_count, void **library,
                      char *found_in, size_t found_in_size)
{
    search s = {.names = names, .name_count = name_count};
    int loaded = try_toolkit(&s) || try_python(&s) || try_environment(&s);
    int status = TP_OK;
    if (loaded) {
        *library = s.library;
        if (found_in_size) snprintf(found_in, found_in_size, "%s", s.found_in);
    } else if (s.refused[0]) {
        status = tp_fail(TP_ERR_DEVICE, "%s (%s) was found but does not load: %s", what, names[0], s.refused);
    } else {
        status = tp_fail(TP_ERR_DEVICE,
                         "%s (%s) not found; looked in %s; install the CUDA toolkit or PyTorch's nvidia wheels, or set "
                         "TP_CUDA_LIBRARY_PATH to the directory that holds it",
                         what, names[0], s.looked.failed ? "(out of memory)" : s.looked.data);
    }
    free(s.looked.data);
    return status;
}

int cuda_library_symbols(void *library, const char *what, const char *where, const cuda_library_symbol *symbols,
                         size_t count)
{
    for (size_t i = 0; i < count; i++) {
        void *address = dlsym(library, symbols[i].name);
        if (!address) return tp_fail(TP_ERR_DEVICE, "%s (%s) has no %s", what, where, symbols[i].name);
        *symbols[i].address = address;
    }
    return TP_OK;
}
