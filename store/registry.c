/* registry.c: which store a path lives in, in one place. Every scheme a
 * store serves is registered here with its prefix; a path without a scheme
 * is a local one. The built-in schemes come first; store_register adds
 * others (a test's store, a new protocol) without this file knowing them. */
#include <pthread.h>
#include <string.h>

#include "../common/error.h"
#include "../common/path.h"
#include "store.h"

#define SCHEMES_MAX 16

typedef struct {
    const char *prefix; /* "s3://" */
    const store_ops *(*builtin)(void);
    const store_ops *ops; /* registered at run time */
} scheme;

static scheme schemes[SCHEMES_MAX] = {
    {"http://", store_webdav, NULL},
    {"https://", store_webdav, NULL},
    {"s3://", store_s3, NULL},
};
static int num_schemes = 3;
static pthread_mutex_t schemes_lock = PTHREAD_MUTEX_INITIALIZER;

int store_register(const char *prefix, const store_ops *ops)
{
    const char *end = strstr(prefix, "://");
    if (!end || end == prefix || end[3] != '\0')
        return tp_fail(TP_ERR_ARG, "'%s' is not a URL scheme prefix (scheme://)", prefix);
    pthread_mutex_lock(&schemes_lock);
    int status = TP_OK;
    for (int i = 0; !status && i < num_schemes; i++)
        if (!strcmp(schemes[i].prefix, prefix)) status = tp_fail(TP_ERR_EXISTS, "%s URLs have a store already", prefix);
    if (!status && num_schemes == SCHEMES_MAX)
        status = tp_fail(TP_ERR_NOMEM, "no room for the store of %s URLs (%d schemes at most)", prefix, SCHEMES_MAX);
    if (!status) schemes[num_schemes++] = (scheme){prefix, NULL, ops};
    pthread_mutex_unlock(&schemes_lock);
    return status;
}

/* The store registered for path's scheme, or NULL. */
static const store_ops *registered(const char *path)
{
    const store_ops *found = NULL;
    pthread_mutex_lock(&schemes_lock);
    for (int i = 0; !found && i < num_schemes; i++)
        if (!strncmp(path, schemes[i].prefix, strlen(schemes[i].prefix)))
            found = schemes[i].ops ? schemes[i].ops : schemes[i].builtin();
    pthread_mutex_unlock(&schemes_lock);
    return found;
}

int store_is_remote(const char *path)
{
    return registered(path) != NULL;
}

int store_for(const char *path, const store_ops **out)
{
    const char *end = strstr(path, "://");
    int url = tp_path_is_url(path);
    /* User information (s3://KEY:SECRET@bucket, http://user:pass@host) is
     * refused first, before any message could repeat the URL. */
    if (tp_url_has_user_info(path))
        return tp_fail(TP_ERR_ARG, "credentials in URLs are refused (they would show in logs): give them in the "
                       "environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3://)");
    if (url && (*out = registered(path)) != NULL) return TP_OK;
    if (url)
        return tp_fail(TP_ERR_ARG, "%s: checkpoints live in local paths, http(s):// or s3:// locations, not in %.*s://",
                       path, (int)(end - path), path);
    *out = store_posix();
    return TP_OK;
}

/* The store of url, which must write whole objects. */
static int object_store(const char *url, const store_ops **out)
{
    TP_TRY(store_for(url, out));
    if (!(*out)->put_file)
        return tp_fail(TP_ERR_STATE, "%s: not an http(s):// or s3:// location (whole objects go to object stores)",
                       url);
    return TP_OK;
}

int store_put_file(const char *url, const char *local_path, int64_t offset, int64_t length, int threads)
{
    const store_ops *s;
    TP_TRY(object_store(url, &s));
    return s->put_file(s, url, local_path, offset, length, threads);
}

int store_put_data(const char *url, const void *data, size_t size)
{
    const store_ops *s;
    TP_TRY(object_store(url, &s));
    return s->put_data(s, url, data, size);
}

int store_delete(const char *url)
{
    const store_ops *s;
    TP_TRY(object_store(url, &s));
    return s->delete_object(s, url);
}
