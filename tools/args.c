/* corefit's option parser and error reporting, shared by every subcommand (and fuzzed by
 * fuzz/fuzz_cli_args.c). */
#include "corefit.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* Where usage and failure messages go (stderr; the fuzzer points it elsewhere). */
FILE *cli_messages;

int cli_error(int code, const char *cmd, const char *fmt, ...) {
    FILE *out = cli_messages ? cli_messages : stderr;
    va_list ap;
    va_start(ap, fmt);
    fprintf(out, "corefit%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    vfprintf(out, fmt, ap);
    fputc('\n', out);
    va_end(ap);
    return code;
}

int cli_lib_error(const char *cmd, const char *what) {
    const char *msg = cf_last_error();
    return cli_error(CLI_FAIL, cmd, "%s: %s", what, msg && *msg ? msg : "failed");
}

int strlist_split(const char *s, strlist *out) {
    out->v = NULL;
    out->n = 0;
    if (!s || !*s) return 0;
    int cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    out->v = cf_calloc((size_t)cap, sizeof(char *));
    if (!out->v) return -1;
    const char *p = s;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char *item = cf_malloc(n + 1);
        if (!item) return -1;
        memcpy(item, p, n);
        item[n] = '\0';
        out->v[out->n++] = item;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

void strlist_free(strlist *l) {
    for (int i = 0; i < l->n; i++) cf_free(l->v[i]);
    cf_free(l->v);
    l->v = NULL;
    l->n = 0;
}

void cli_print_options(FILE *f, const cli_opt *opts) {
    for (const cli_opt *o = opts; o->name; o++) {
        char left[64];
        if (o->kind == OPT_FLAG)
            snprintf(left, sizeof left, "%s", o->name);
        else
            snprintf(left, sizeof left, "%s %s", o->name, o->metavar ? o->metavar : "X");
        fprintf(f, "  %-24s %s\n", left, o->help);
    }
    fprintf(f, "  %-24s %s\n", "-h, --help", "show this help");
}

static int set_value(const char *cmd, cli_opt *o, const char *v) {
    char *end;
    errno = 0;
    switch (o->kind) {
    case OPT_FLAG:
        *(bool *)o->dest = true;
        return CLI_OK;
    case OPT_STR:
        if (!*v)
            return cli_error(CLI_USAGE, cmd, "%s expects a value, got an empty string", o->name);
        *(const char **)o->dest = v;
        return CLI_OK;
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (end == v || *end || errno || x < (long)o->min || x > (long)o->max)
            return cli_error(CLI_USAGE, cmd, "%s expects a whole number in [%.0f, %.0f], got '%s'",
                             o->name, o->min, o->max, v);
        *(int *)o->dest = (int)x;
        return CLI_OK;
    }
    case OPT_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (end == v || *end || errno || *v == '-')
            return cli_error(CLI_USAGE, cmd, "%s expects a non-negative whole number, got '%s'",
                             o->name, v);
        *(uint64_t *)o->dest = x;
        return CLI_OK;
    }
    case OPT_DOUBLE: {
        double x = strtod(v, &end);
        if (end == v || *end || !isfinite(x) || (o->min <= o->max && (x < o->min || x > o->max)))
            return cli_error(CLI_USAGE, cmd, "%s expects a number in [%g, %g], got '%s'", o->name,
                             o->min, o->max, v);
        *(double *)o->dest = x;
        return CLI_OK;
    }
    }
    return CLI_USAGE;
}

int cli_parse(const char *cmd, int argc, char **argv, int first, cli_opt *opts, const char **pos,
              int max_pos, int *n_pos) {
    *n_pos = 0;
    bool only_pos = false;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            if (*n_pos >= max_pos)
                return cli_error(CLI_USAGE, cmd, "unexpected argument '%s' (see corefit %s --help)",
                                 a, cmd);
            pos[(*n_pos)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_pos = true;
            continue;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return -1;
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        cli_opt *o = NULL;
        for (cli_opt *p = opts; p->name; p++)
            if (strlen(p->name) == len && strncmp(p->name, a, len) == 0) o = p;
        if (!o)
            return cli_error(CLI_USAGE, cmd, "unknown option '%.*s' (see corefit %s --help)",
                             (int)len, a, cmd);
        const char *v = NULL;
        if (o->kind == OPT_FLAG) {
            if (eq) return cli_error(CLI_USAGE, cmd, "%s takes no value", o->name);
        } else if (eq) {
            v = eq + 1;
        } else if (i + 1 < argc) {
            v = argv[++i];
        } else {
            return cli_error(CLI_USAGE, cmd, "%s expects a value (%s)", o->name,
                             o->metavar ? o->metavar : "X");
        }
        int rc = set_value(cmd, o, v);
        if (rc != CLI_OK) return rc;
        o->seen = true;
    }
    return CLI_OK;
}

int cli_parse_or_usage(const char *cmd, int argc, char **argv, cli_opt *opts, const char **pos,
                       int max_pos, int *n_pos, cli_usage_fn usage, bool *help) {
    *help = false;
    int rc = cli_parse(cmd, argc, argv, 2, opts, pos, max_pos, n_pos);
    if (rc < 0) {
        usage(stdout, opts);
        *help = true;
        return CLI_OK;
    }
    return rc;
}
