/* Crash-safe model and checkpoint files: a saving process killed (SIGKILL) at random points of
 * the write leaves the previous file intact and loadable (or the new one complete), temporary
 * files are private (0600 even with umask 0), and a full disk (RLIMIT_FSIZE, a size-limited
 * tmpfs) gives a clear error and keeps the old file with no temporary file left; SIGINT, SIGTERM
 * and SIGHUP during a save leave no temporary file, and one left by SIGKILL is removed by the
 * next save to the same target. */
#include "child.h"
#include "oracle.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "corefit/io.h"

/* A checkpoint of a few MB: weights, Adam's two averages and step counts. */
typedef struct ckpt {
    cf_model *model;
    cf_optimizer *opt;
} ckpt;

static ckpt make_ckpt(uint64_t seed) {
    cf_module *layers[] = {cf_linear(512, 1024, true), cf_relu(), cf_linear(1024, 10, true)};
    ckpt c = {0};
    assert_int_equal(cf_model_new(&c.model, cf_sequential(3, layers), seed), CF_OK);
    assert_int_equal(cf_optimizer_new(&c.opt, c.model, &(cf_opt_config){.kind = CF_OPT_ADAM}),
                     CF_OK);
    size_t n = c.model->n_weights;
    fill_uniform(c.opt->grad_avg, n, seed + 1, -1, 1);
    fill_uniform(c.opt->sqr_avg, n, seed + 2, 0, 1);
    for (int i = 0; i < c.model->n_params; i++) c.opt->steps[i] = (float)(seed % 100 + 1);
    return c;
}

static void free_ckpt(ckpt *c) {
    cf_optimizer_free(c->opt);
    cf_model_free(c->model);
}

/* Which of a, b the loaded c equals exactly (0 for a, 1 for b, -1 for neither). */
static int which(const ckpt *c, const ckpt *a, const ckpt *b) {
    size_t bytes = c->model->n_weights * sizeof(float);
    const ckpt *cand[2] = {a, b};
    for (int i = 0; i < 2; i++)
        if (!memcmp(c->model->weights, cand[i]->model->weights, bytes) &&
            !memcmp(c->opt->grad_avg, cand[i]->opt->grad_avg, bytes) &&
            !memcmp(c->opt->sqr_avg, cand[i]->opt->sqr_avg, bytes) &&
            !memcmp(c->opt->steps, cand[i]->opt->steps, (size_t)c->model->n_params * sizeof(float)))
            return i;
    return -1;
}

/* Removes temporary files left next to `base` in dir; returns how many; fails unless each is
 * private to the user (0600). */
static int sweep_temp_files(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s.tmp-", base);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0) {
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, base))
                fail_msg("unexpected file %s/%s", dir, e->d_name);
            continue;
        }
        char path[600];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        assert_int_equal(stat(path, &sb), 0);
        if ((sb.st_mode & 07777) != 0600)
            fail_msg("temporary file %s has mode %04o, not 0600", path, sb.st_mode & 07777);
        unlink(path);
        n++;
    }
    closedir(d);
    return n;
}

static void test_kill_during_save_keeps_a_loadable_file(void **state) {
    (void)state;
    oracle dir;
    oracle_init(&dir);
    char path[400];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir.dir);
    ckpt a = make_ckpt(11), b = make_ckpt(12), c = make_ckpt(13);
    assert_int_equal(cf_model_save(a.model, a.opt, path), CF_OK);
    /* How long one save takes here, so the kills spread over the whole write. */
    double t0 = cf_now();
    assert_int_equal(cf_model_save(a.model, a.opt, path), CF_OK);
    double save_s = cf_now() - t0;
    cf_rng rng;
    cf_rng_seed(&rng, (uint64_t)time(NULL));
    int current = 0, kept_old = 0, got_new = 0, mid_write = 0, iters = 0;
    double start = cf_now();
    while (iters < 200 && (cf_now() - start < 3.0 || mid_write < 3) && cf_now() - start < 20) {
        const ckpt *next = current ? &a : &b;
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            umask(0); /* the temporary file must still be 0600 */
            _exit(cf_model_save(next->model, next->opt, path) == CF_OK ? 0 : 1);
        }
        useconds_t delay = (useconds_t)(cf_rng_uniform(&rng) * save_s * 1.3e6);
        usleep(delay);
        kill(pid, SIGKILL);
        int ws;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        if (WIFEXITED(ws)) assert_int_equal(WEXITSTATUS(ws), 0);
        mid_write += sweep_temp_files(dir.dir, "ckpt.safetensors");
        cf_status st = cf_model_load(c.model, c.opt, path);
        if (st != CF_OK)
            fail_msg("after a kill %d us into a save: %s", (int)delay, cf_last_error());
        int w = which(&c, &a, &b);
        if (w < 0)
            fail_msg("after a kill %d us into a save the file holds neither version", (int)delay);
        if (w == current) {
            kept_old++;
        } else {
            got_new++;
            current = w;
        }
        iters++;
    }
    printf("crash-safe: %d saves killed at random points (save takes %.1f ms): old file kept %d, "
           "new file complete %d, killed with the temporary file written %d\n",
           iters, save_s * 1e3, kept_old, got_new, mid_write);
    assert_true(mid_write > 0); /* some kills did land inside the write */
    assert_true(kept_old > 0);
    free_ckpt(&a), free_ckpt(&b), free_ckpt(&c);
    oracle_cleanup(&dir);
}

/* A fresh file gets 0666 & ~umask like any new file; an existing one keeps its mode. */
static void test_modes(void **state) {
    (void)state;
    oracle dir;
    oracle_init(&dir);
    char path[400];
    snprintf(path, sizeof path, "%s/m.safetensors", dir.dir);
    ckpt a = make_ckpt(21);
    mode_t old = umask(027);
    assert_int_equal(cf_model_save(a.model, NULL, path), CF_OK);
    umask(old);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0640);
    assert_int_equal(chmod(path, 0600), 0);
    assert_int_equal(cf_model_save(a.model, a.opt, path), CF_OK);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 07777, 0600);
    assert_int_equal(sweep_temp_files(dir.dir, "m.safetensors"), 0);
    free_ckpt(&a);
    oracle_cleanup(&dir);
}

/* Runs fn in a child and returns its status and message. The child may change its limits,
 * signals and mounts without touching the test process. */
static void save_under_fsize_limit(const char *dir, test_outcome *o) {
    char path[400];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
    ckpt b = make_ckpt(32);
    signal(SIGXFSZ, SIG_IGN); /* write() then fails with EFBIG instead of killing */
    struct rlimit rl = {1 << 20, 1 << 20};
    setrlimit(RLIMIT_FSIZE, &rl);
    o->status = (int)cf_model_save(b.model, b.opt, path);
    snprintf(o->msg, sizeof o->msg, "%s", cf_last_error());
    free_ckpt(&b);
}

/* Saves a (fits) then b (does not fit) on a tmpfs a little larger than one checkpoint, mounted in
 * a private mount namespace; then checks a is what loads. */
static void save_on_small_tmpfs(const char *dir, test_outcome *o) {
    char mnt[400], path[500];
    snprintf(mnt, sizeof mnt, "%s/small", dir);
    snprintf(path, sizeof path, "%s/ckpt.safetensors", mnt);
    mkdir(mnt, 0700);
    ckpt a = make_ckpt(41), b = make_ckpt(42), c = make_ckpt(43);
    size_t bytes = a.model->n_weights * 3 * sizeof(float);
    char opts[64];
    snprintf(opts, sizeof opts, "size=%zuk", bytes * 3 / 2 / 1024);
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, opts) != 0) {
        o->status = -1;
        snprintf(o->msg, sizeof o->msg, "cannot mount a tmpfs here: %s", strerror(errno));
        goto out;
    }
    if (cf_model_save(a.model, a.opt, path) != CF_OK) {
        o->status = -2;
        snprintf(o->msg, sizeof o->msg, "the first save failed: %s", cf_last_error());
        goto out;
    }
    o->status = (int)cf_model_save(b.model, b.opt, path);
    snprintf(o->msg, sizeof o->msg, "%s", cf_last_error());
    if (cf_model_load(c.model, c.opt, path) != CF_OK || which(&c, &a, &b) != 0) {
        o->status = -3;
        snprintf(o->msg, sizeof o->msg, "the old file did not load back: %s", cf_last_error());
    }
    DIR *d = opendir(mnt);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, "ckpt.safetensors")) {
            o->status = -4;
            snprintf(o->msg, sizeof o->msg, "%s was left on the full disk", e->d_name);
        }
    if (d) closedir(d);
    umount(mnt);
out:
    free_ckpt(&a), free_ckpt(&b), free_ckpt(&c);
}

static void test_full_disk_keeps_the_old_file(void **state) {
    (void)state;
    oracle dir;
    oracle_init(&dir);
    char path[400];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir.dir);
    /* static: the forked children exit with these still reachable */
    static ckpt a, b, c;
    a = make_ckpt(31), b = make_ckpt(32), c = make_ckpt(33);
    assert_int_equal(cf_model_save(a.model, a.opt, path), CF_OK);

    /* RLIMIT_FSIZE: the file size limit of the saving process. */
    test_outcome o = test_in_child(save_under_fsize_limit, dir.dir);
    assert_int_equal(o.status, CF_ERR_IO);
    if (!strstr(o.msg, path) || !strstr(o.msg, strerror(EFBIG)) || !strstr(o.msg, "unchanged"))
        fail_msg("unclear message: %s", o.msg);
    assert_int_equal(cf_model_load(c.model, c.opt, path), CF_OK);
    assert_int_equal(which(&c, &a, &b), 0);
    assert_int_equal(sweep_temp_files(dir.dir, "ckpt.safetensors"), 0);

    /* A full file system. */
    o = test_in_child(save_on_small_tmpfs, dir.dir);
    if (o.status == -1) {
        printf("crash-safe: full tmpfs case skipped: %s\n", o.msg);
    } else {
        if (o.status != CF_ERR_IO) fail_msg("full tmpfs: status %d: %s", o.status, o.msg);
        if (!strstr(o.msg, strerror(ENOSPC)) || !strstr(o.msg, "unchanged"))
            fail_msg("unclear message: %s", o.msg);
    }
    rmdir(strcat(strcpy(path, dir.dir), "/small"));
    free_ckpt(&a), free_ckpt(&b), free_ckpt(&c);
    oracle_cleanup(&dir);
}

/* ---- temporary files after signals ------------------------------------------------------- */

/* Temporary files of `base` in dir (not removed). */
static int count_temp_files(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s.tmp-", base);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

/* Saves a 32 MB tensor again and again (the child of the signal tests). */
static _Noreturn void save_forever(const char *path) {
    size_t n = (size_t)8 << 20;
    float *w = calloc(n, sizeof *w);
    if (!w) _exit(2);
    cf_st_entry e = {
        .name = "w", .dtype = CF_DTYPE_F32, .shape = cf_shape1((int)n), .numel = n, .data = w};
    for (;;)
        if (cf_st_write(path, &e, 1, NULL, NULL, 0) != CF_OK) _exit(3);
}

/* Starts save_forever and waits until it is inside a write (its temporary file exists). */
static pid_t start_saving(const char *dir, const char *path) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
        save_forever(path);
    }
    double t0 = cf_now();
    while (count_temp_files(dir, "big.safetensors") == 0 && cf_now() - t0 < 20 * test_time_scale())
        usleep(200);
    return pid;
}

/* SIGINT, SIGTERM and SIGHUP in the middle of a save end the process as before (by that
 * signal) but leave no temporary file; the target stays a complete file. */
static void test_signals_remove_the_temporary_file(void **state) {
    (void)state;
    oracle dir;
    oracle_init(&dir);
    char path[400];
    snprintf(path, sizeof path, "%s/big.safetensors", dir.dir);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int k = 0; k < 3; k++) {
        pid_t pid = start_saving(dir.dir, path);
        int seen = count_temp_files(dir.dir, "big.safetensors");
        kill(pid, sigs[k]);
        int ws;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        if (!WIFSIGNALED(ws) || WTERMSIG(ws) != sigs[k])
            fail_msg("the saving process did not end by signal %d (status 0x%x)", sigs[k], ws);
        assert_int_equal(seen, 1);
        int left = count_temp_files(dir.dir, "big.safetensors");
        printf("crash-safe: signal %d during a save: %d temporary file(s) left\n", sigs[k], left);
        assert_int_equal(left, 0);
        cf_st_file *f = NULL;
        if (access(path, F_OK) == 0) {
            assert_int_equal(cf_st_read(path, &f), CF_OK);
            cf_st_free(f);
        }
    }
    oracle_cleanup(&dir);
}

/* A save killed with SIGKILL leaves its temporary file; the next save to the same target removes
 * it, and leaves alone another target's and one that a live save holds (locked). */
static void test_next_save_removes_stale_temporaries(void **state) {
    (void)state;
    oracle dir;
    oracle_init(&dir);
    char path[400], other[400], held[420];
    snprintf(path, sizeof path, "%s/big.safetensors", dir.dir);
    snprintf(other, sizeof other, "%s/other.safetensors.tmp-abc123", dir.dir);
    snprintf(held, sizeof held, "%s.tmp-HELD00", path);
    pid_t pid = start_saving(dir.dir, path);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(count_temp_files(dir.dir, "big.safetensors"), 1);
    FILE *f = fopen(other, "w");
    assert_non_null(f);
    fclose(f);
    /* A save in progress elsewhere: its temporary file is locked by a live process. */
    int ready[2];
    assert_int_equal(pipe(ready), 0);
    pid_t holder = fork();
    assert_true(holder >= 0);
    if (holder == 0) {
        int fd = open(held, O_CREAT | O_EXCL | O_WRONLY, 0600);
        if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(1);
        ssize_t w = write(ready[1], "x", 1);
        (void)w;
        pause();
        _exit(0);
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);
    float x[4] = {1, 2, 3, 4};
    cf_st_entry e = {
        .name = "w", .dtype = CF_DTYPE_F32, .shape = cf_shape1(4), .numel = 4, .data = x};
    assert_int_equal(cf_st_write(path, &e, 1, NULL, NULL, 0), CF_OK);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    close(ready[0]), close(ready[1]);
    assert_int_equal(count_temp_files(dir.dir, "big.safetensors"), 1); /* the held one */
    assert_int_equal(access(held, F_OK), 0);
    assert_int_equal(access(other, F_OK), 0);
    /* Now nobody holds it: the next save removes it too. */
    assert_int_equal(cf_st_write(path, &e, 1, NULL, NULL, 0), CF_OK);
    assert_int_equal(count_temp_files(dir.dir, "big.safetensors"), 0);
    assert_int_equal(access(other, F_OK), 0);
    oracle_cleanup(&dir);
}

/* Processes saving to one target at the same time: each save removes the others' temporary
 * files only when no one holds them, so every save succeeds (a file taken for stale between its
 * creation and its lock once made a concurrent save fail with "cannot rename ... No such
 * file") and the target is always one complete model. */
static void test_concurrent_saves_all_succeed(void **state) {
    (void)state;
    oracle dir;
    oracle_init(&dir);
    char path[400];
    snprintf(path, sizeof path, "%s/shared.safetensors", dir.dir);
    enum { WRITERS = 4, SAVES = 300 };
    pid_t pids[WRITERS];
    for (int k = 0; k < WRITERS; k++) {
        pids[k] = fork();
        assert_true(pids[k] >= 0);
        if (pids[k] == 0) {
            float x[64];
            for (int i = 0; i < 64; i++) x[i] = (float)(k * 1000 + i);
            cf_st_entry e = {
                .name = "w", .dtype = CF_DTYPE_F32, .shape = cf_shape1(64), .numel = 64, .data = x};
            for (int i = 0; i < SAVES; i++)
                if (cf_write_file_atomic(path, x, sizeof x) != CF_OK ||
                    cf_st_write(path, &e, 1, NULL, NULL, 0) != CF_OK) {
                    fprintf(stderr, "writer %d, save %d: %s\n", k, i, cf_last_error());
                    _exit(1);
                }
            _exit(0);
        }
    }
    for (int k = 0; k < WRITERS; k++) {
        int status;
        assert_int_equal(waitpid(pids[k], &status, 0), pids[k]);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("writer %d failed a save (status %d)", k, status);
    }
    cf_st_file *f;
    if (cf_st_read(path, &f) != CF_OK) fail_msg("%s", cf_last_error());
    cf_st_free(f);
    assert_int_equal(count_temp_files(dir.dir, "shared.safetensors"), 0);
    oracle_cleanup(&dir);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_during_save_keeps_a_loadable_file),
        cmocka_unit_test(test_modes),
        cmocka_unit_test(test_full_disk_keeps_the_old_file),
        cmocka_unit_test(test_signals_remove_the_temporary_file),
        cmocka_unit_test(test_next_save_removes_stale_temporaries),
        cmocka_unit_test(test_concurrent_saves_all_succeed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
