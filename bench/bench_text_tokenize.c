/* Tokenizing Debian's whole fortunes corpus (every quotation of every topic file) with fastai's
 * rules and the spaCy-style splitter: corefit on every core (cf_text_tokenize_texts) against
 * the Python implementation of the same rules (tests/text_oracle.py, one process, as fastai's
 * rules run in Python), in one run.
 *
 *   bench_text_tokenize [--threads N] [--repeat R] [--dir /usr/share/games/fortunes]
 *
 * Prints one JSON line: texts, tokens, corefit's best of R wall times (and the CPU time of
 * that run, all threads), the Python wall and CPU times (its own measurement around the
 * tokenizing loop, start-up and reading excluded), speedup = Python wall / corefit wall and
 * cpu_ratio = Python CPU / corefit CPU (the per-core speed, which a loaded machine disturbs
 * less than wall times). Both produce the same tokens (test_text_tokenize checks that on three of
 * the files). */
#include <corefit.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef CF_SOURCE_DIR
#define CF_SOURCE_DIR "."
#endif

typedef struct texts {
    char **text;
    size_t *len;
    int64_t n, cap;
} texts;

static void add_text(texts *t, const char *s, size_t len) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->text = realloc(t->text, (size_t)t->cap * sizeof *t->text);
        t->len = realloc(t->len, (size_t)t->cap * sizeof *t->len);
    }
    t->text[t->n] = strndup(s, len);
    t->len[t->n++] = len;
}

/* Quotations are separated by lines holding only '%' (text_oracle.py's fortunes()). */
static void read_fortunes(const char *path, texts *t) {
    void *data;
    size_t size;
    if (cf_read_file(path, (size_t)1 << 28, &data, &size) != CF_OK) {
        fprintf(stderr, "%s\n", cf_last_error());
        exit(1);
    }
    char *s = data, *line = s, *start = s;
    for (;;) {
        char *nl = strchr(line, '\n');
        size_t ll = nl ? (size_t)(nl - line) : strlen(line);
        if (ll == 1 && line[0] == '%') {
            add_text(t, start, line > start ? (size_t)(line - start - 1) : 0);
            start = nl ? nl + 1 : line + ll;
        }
        if (!nl) break;
        line = nl + 1;
    }
    /* a last quotation without its '%' (text_oracle.py keeps it when it holds anything) */
    if (*start) add_text(t, start, strlen(start));
    cf_free(data);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
    const char *dir = "/usr/share/games/fortunes";
    int threads = cf_available_cores(), repeat = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dir") && i + 1 < argc)
            dir = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--threads N] [--repeat R] [--dir DIR]\n", argv[0]);
            return 2;
        }
    }
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "%s: cannot open (apt-get install fortunes)\n", dir);
        return 1;
    }
    char *names[256];
    int n_files = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_files < 256)
        if (e->d_name[0] != '.' && !strchr(e->d_name, '.')) names[n_files++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n_files, sizeof *names, by_name);
    texts t = {0};
    size_t cmd_len = 256 + strlen(CF_SOURCE_DIR);
    for (int i = 0; i < n_files; i++) cmd_len += strlen(dir) + strlen(names[i]) + 2;
    char *cmd = malloc(cmd_len), path[4096];
    snprintf(cmd, cmd_len, "/usr/bin/python3 %s/tests/text_oracle.py bench", CF_SOURCE_DIR);
    for (int i = 0; i < n_files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        read_fortunes(path, &t);
        strcat(strcat(strcat(cmd, " "), path), "");
    }
    cf_set_num_threads(threads);
    double best = 1e30, best_cpu = 0;
    int64_t n_tokens = 0;
    for (int r = 0; r < repeat; r++) {
        cf_text_tokens *per;
        cf_text_counter *counts;
        struct timespec c0, c1;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        double t0 = cf_now();
        if (cf_text_tokenize_texts((const char *const *)t.text, t.len, NULL, t.n, NULL, &per,
                                   &counts) != CF_OK) {
            fprintf(stderr, "%s\n", cf_last_error());
            return 1;
        }
        double took = cf_now() - t0;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        if (took < best) {
            best = took;
            best_cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
        }
        n_tokens = 0;
        for (int64_t i = 0; i < t.n; i++) {
            n_tokens += per[i].n;
            cf_text_tokens_free(&per[i]);
        }
        cf_free(per);
        cf_text_counter_free(counts);
    }
    /* the oracle prints "<texts> texts <tokens> tokens <seconds> s" */
    FILE *p = popen(cmd, "r");
    long long py_texts = 0, py_tokens = 0;
    double py_s = 0, py_cpu = 0;
    if (!p || fscanf(p, "%lld texts %lld tokens %lf s %lf cpu", &py_texts, &py_tokens, &py_s,
                     &py_cpu) != 4) {
        fprintf(stderr, "the Python oracle failed: %s\n", cmd);
        return 1;
    }
    pclose(p);
    if (py_texts != t.n || py_tokens != n_tokens)
        fprintf(stderr, "warning: Python saw %lld texts / %lld tokens, corefit %lld / %lld\n",
                py_texts, py_tokens, (long long)t.n, (long long)n_tokens);
    printf("{\"bench\":\"text_tokenize\",\"files\":%d,\"texts\":%lld,\"tokens\":%lld,"
           "\"threads\":%d,\"corefit_s\":%.4f,\"corefit_cpu_s\":%.4f,\"python_s\":%.4f,"
           "\"python_cpu_s\":%.4f,\"speedup\":%.1f,\"cpu_ratio\":%.1f,"
           "\"corefit_tokens_per_s\":%.0f}\n",
           n_files, (long long)t.n, (long long)n_tokens, threads, best, best_cpu, py_s, py_cpu,
           py_s / best, py_cpu / best_cpu, n_tokens / best);
    for (int64_t i = 0; i < t.n; i++) free(t.text[i]);
    free(t.text);
    free(t.len);
    for (int i = 0; i < n_files; i++) free(names[i]);
    free(cmd);
    return 0;
}
