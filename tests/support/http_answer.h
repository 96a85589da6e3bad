/* http_answer.h: an answer of a server, as store/http.c hands it to the
 * code that judges it, for the store's unit tests. */
#ifndef TP_TESTS_HTTP_ANSWER_H
#define TP_TESTS_HTTP_ANSWER_H

#include <stdio.h>
#include <string.h>

#include "../../store/http.h"

/* Status code and the body's text (an S3 error document, or ""). */
static inline http_response http_answer(long code, const char *body)
{
    http_response r;
    memset(&r, 0, sizeof r);
    r.code = code;
    snprintf(r.error_body, sizeof r.error_body, "%s", body);
    return r;
}

#endif
