/* Thread-local error messages. */
#include "corefit/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define CF_ERROR_MAX 1024

static _Thread_local char last_error[CF_ERROR_MAX];

const char *cf_last_error(void) {
    return last_error;
}

void cf_clear_error(void) {
    last_error[0] = '\0';
}

const char *cf_status_str(cf_status status) {
    switch (status) {
    case CF_OK:
        return "ok";
    case CF_ERR_INVALID:
        return "invalid argument";
    case CF_ERR_IO:
        return "i/o error";
    case CF_ERR_FORMAT:
        return "bad file format";
    case CF_ERR_NOMEM:
        return "out of memory";
    case CF_ERR_STATE:
        return "bad state";
    case CF_ERR_UNSUPPORTED:
        return "unsupported";
    case CF_ERR_WORKER:
        return "worker failed";
    case CF_ERR_INTERRUPTED:
        return "interrupted";
    case CF_ERR_NONFINITE:
        return "non-finite value";
    }
    return "unknown status";
}

cf_status cf_fail(cf_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

cf_status cf_fail_context(cf_status status, const char *fmt, ...) {
    char prefix[CF_ERROR_MAX], old[CF_ERROR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_error, sizeof old);
    size_t at = strlen(prefix);
    if (at > CF_ERROR_MAX - 3) at = CF_ERROR_MAX - 3;
    memcpy(last_error, prefix, at);
    memcpy(last_error + at, ": ", 2);
    at += 2;
    size_t rest = strnlen(old, CF_ERROR_MAX - 1 - at);
    memcpy(last_error + at, old, rest);
    last_error[at + rest] = '\0';
    return status;
}
