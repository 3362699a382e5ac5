/* `corefit train` under the faults a shared machine brings (issue 26): pre-emption by SIGTERM
 * to the whole process group (workers included, several times over), outputs that are devices
 * or FIFOs, a disk that fills up during a fit, the commit directory a killed supervisor left,
 * a resume that adds logging options, a checkpoint crafted with a valid CRC, and a pretrained
 * model with NaN weights. Each runs the command on a small slice of Fashion-MNIST. */
#include "child.h"
#include "oracle.h"

#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "corefit.h"

#define FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define SMALL "train --limit 640 --bs 32 --epochs 2 --quiet"

static void need_data(void) {
    struct stat sb;
    if (stat(FMNIST_DIR, &sb) != 0) skip();
}

static bool same_file(const char *dir, const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = test_read_in(dir, a, &na), *y = test_read_in(dir, b, &nb);
    bool same = x && y && na == nb && memcmp(x, y, na) == 0;
    cf_free(x);
    cf_free(y);
    return same;
}

static bool exists(const char *dir, const char *name) {
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return lstat(path, &sb) == 0;
}

/* The stderr of the last command, for messages (freed at exit). */
static const char *err_of(const char *dir) {
    static char *last;
    cf_free(last);
    last = test_read_in(dir, "err.txt", NULL);
    return last ? last : "(no err.txt)";
}

/* Whether process pid has children yet (the fork workers). */
static bool has_children(pid_t pid) {
    char path[128], buf[64] = "";
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n > 0 && buf[0] >= '0' && buf[0] <= '9';
}

/* ---- 1. SIGTERM to the process group ----------------------------------------------------------
 * Pre-emption (Slurm, timeout, a container runtime) signals every process of the group: the
 * workers get the TERM too, maybe first, and three of them come in quick succession. The fit
 * must stop at a batch with a checkpoint and a hint (exit 1), not lose a worker (or restart the
 * group), and the hint must finish it with the same model as a fit never stopped. */
#define GROUP_ARGS                                                                                 \
    "train --limit 3000 --bs 32 --epochs 2 --quiet --cores 2 --max-restarts 1 "                    \
    "--checkpoint-every 0"

static void test_group_sigterm_keeps_the_fit(void **state) {
    (void)state;
    need_data();
    oracle dir;
    oracle_init(&dir);
    assert_int_equal(test_cli_run(dir.dir, GROUP_ARGS " --out full.safetensors"), 0);
    pid_t pid = test_cli_start(dir.dir, GROUP_ARGS " --out part.safetensors", true);
    /* as soon as the workers exist (early in the first epoch, before any checkpoint) */
    while (!has_children(pid)) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) fail_msg("corefit ended before forking");
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    for (int i = 0; i < 3; i++) {
        kill(-pid, SIGTERM);
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
    int rc = test_cli_wait(pid);
    const char *err = err_of(dir.dir);
    if (rc != 1 || !strstr(err, "SIGTERM") || !strstr(err, "--resume ./part.ckpt") ||
        strstr(err, "killed by signal") || strstr(err, "restarting"))
        fail_msg("after SIGTERM to the group: exit %d, stderr: %s", rc, err);
    assert_true(exists(dir.dir, "part.ckpt"));
    assert_false(exists(dir.dir, "part.safetensors"));
    const char *hint = strstr(err, "  corefit ");
    assert_non_null(hint);
    char resume[1024];
    snprintf(resume, sizeof resume, "%.*s", (int)strcspn(hint + 10, "\n"), hint + 10);
    rc = test_cli_run(dir.dir, resume);
    if (rc != 0) fail_msg("resume: exit %d: %s", rc, err_of(dir.dir));
    if (!same_file(dir.dir, "full.safetensors", "part.safetensors"))
        fail_msg("the resumed fit's model differs from the fit never stopped");
    oracle_cleanup(&dir);
}

/* ---- 2. outputs that are devices or FIFOs ---------------------------------------------------
 * A character device (/dev/null, through a link or made with mknod) is written through and
 * stays a device; a FIFO is refused before the fit, by name, and stays a FIFO. */

static void assert_kind(const char *dir, const char *name, mode_t kind, bool link) {
    char path[4200];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    assert_int_equal(lstat(path, &sb), 0);
    if (link) {
        if (!S_ISLNK(sb.st_mode)) fail_msg("%s is no longer a link", name);
        assert_int_equal(stat(path, &sb), 0);
    }
    if ((sb.st_mode & S_IFMT) != kind) fail_msg("%s was replaced (mode 0%o)", name, sb.st_mode);
}

static void test_device_and_fifo_outputs(void **state) {
    (void)state;
    need_data();
    oracle dir;
    oracle_init(&dir);
    char path[4200];
    const char *links[] = {"null.safetensors", "null.csv", "null.ckpt"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir.dir, links[i]);
        assert_int_equal(symlink("/dev/null", path), 0);
    }
    /* every output through links to /dev/null, checkpoints on */
    int rc = test_cli_run(dir.dir, SMALL " --cores 1 --out ./null.safetensors --csv-log ./null.csv "
                                         "--checkpoint ./null.ckpt --checkpoint-every 2");
    if (rc != 0) fail_msg("outputs to /dev/null: exit %d: %s", rc, err_of(dir.dir));
    for (int i = 0; i < 3; i++) assert_kind(dir.dir, links[i], S_IFCHR, true);
    /* a device node of its own (root only), with fork workers */
    snprintf(path, sizeof path, "%s/sink.safetensors", dir.dir);
    if (mknod(path, S_IFCHR | 0666, makedev(1, 3)) == 0) {
        rc =
            test_cli_run(dir.dir, SMALL " --cores 2 --out ./sink.safetensors --checkpoint-every 2");
        if (rc != 0) fail_msg("--out to a device node: exit %d: %s", rc, err_of(dir.dir));
        assert_kind(dir.dir, "sink.safetensors", S_IFCHR, false);
    }
    struct stat sb;
    assert_int_equal(stat("/dev/null", &sb), 0);
    assert_true(S_ISCHR(sb.st_mode));
    /* a FIFO: refused, named, kept */
    snprintf(path, sizeof path, "%s/fifo", dir.dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    const char *uses[] = {"--out ./fifo", "--csv-log ./fifo --out m.safetensors",
                          "--checkpoint ./fifo --out m.safetensors"};
    for (int i = 0; i < 3; i++) {
        char args[512];
        snprintf(args, sizeof args, SMALL " --cores 1 %s", uses[i]);
        rc = test_cli_run(dir.dir, args);
        const char *err = err_of(dir.dir);
        if (rc == 0 || !strstr(err, "fifo") || !strstr(err, "FIFO"))
            fail_msg("%s: exit %d, stderr: %s", uses[i], rc, err);
        assert_kind(dir.dir, "fifo", S_IFIFO, false);
    }
    assert_false(exists(dir.dir, "m.safetensors"));
    oracle_cleanup(&dir);
}

/* ---- 3. a full disk during a periodic checkpoint ----------------------------------------------
 * On a tmpfs with room for one checkpoint and the model but not for two checkpoints, the first
 * checkpoint is written, the next ones fail: each is a warning naming the cause, the first
 * checkpoint stays, and the fit finishes and writes its model. In a mount namespace of its own
 * (root); skipped where one cannot be made. */

static void full_disk_fit(const char *dir, test_outcome *o) {
    char mnt[400], args[1024];
    snprintf(mnt, sizeof mnt, "%s/small", dir);
    mkdir(mnt, 0700);
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", mnt, "tmpfs", 0, "size=2000k") != 0) {
        o->status = -1;
        snprintf(o->msg, sizeof o->msg, "cannot mount a tmpfs here: %s", strerror(errno));
        return;
    }
    snprintf(args, sizeof args,
             "train --limit 640 --bs 32 --epochs 1 --quiet --cores 2 --checkpoint-every 2 "
             "--checkpoint small/fit.ckpt --out small/m.safetensors");
    int rc = test_cli_run(dir, args);
    char *err = test_read_in(dir, "err.txt", NULL);
    struct stat ck, model;
    char path[500];
    snprintf(path, sizeof path, "%s/fit.ckpt", mnt);
    bool have_ck = stat(path, &ck) == 0;
    snprintf(path, sizeof path, "%s/m.safetensors", mnt);
    bool have_model = stat(path, &model) == 0;
    int others = 0;
    char other[256] = "";
    DIR *d = opendir(mnt);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strcmp(e->d_name, "fit.ckpt") &&
            strcmp(e->d_name, "m.safetensors")) {
            others++;
            snprintf(other, sizeof other, "%s", e->d_name);
        }
    if (d) closedir(d);
    o->status = 1;
    if (rc != 0)
        snprintf(o->msg, sizeof o->msg, "exit %d on a full disk: %s", rc, err ? err : "");
    else if (!err || !strstr(err, "warning") || !strstr(err, strerror(ENOSPC)))
        snprintf(o->msg, sizeof o->msg, "no warning naming ENOSPC: %s", err ? err : "");
    else if (!have_model || model.st_size == 0)
        snprintf(o->msg, sizeof o->msg, "no model written");
    else if (!have_ck || ck.st_size < 1000)
        snprintf(o->msg, sizeof o->msg, "the first checkpoint was not kept");
    else if (others)
        snprintf(o->msg, sizeof o->msg, "%s was left on the full disk", other);
    else
        o->status = 0;
    cf_free(err);
    umount(mnt);
}

static void test_full_disk_checkpoint_warns_and_goes_on(void **state) {
    (void)state;
    need_data();
    oracle dir;
    oracle_init(&dir);
    test_outcome o = test_in_child(full_disk_fit, dir.dir);
    oracle_cleanup(&dir);
    if (o.status < 0) {
        fprintf(stderr, "skipped: %s\n", o.msg);
        skip();
    }
    if (o.status) fail_msg("%s", o.msg);
}

/* ---- 4. the commit directory of a killed supervisor ---------------------------------------- */

static void test_stale_commit_directory_is_swept(void **state) {
    (void)state;
    need_data();
    struct stat sb;
    if (stat("/dev/shm", &sb) != 0 || !S_ISDIR(sb.st_mode) || access("/dev/shm", W_OK) != 0) skip();
    /* a pid that is gone */
    pid_t dead = fork();
    assert_true(dead >= 0);
    if (dead == 0) _exit(0);
    assert_int_equal(waitpid(dead, NULL, 0), dead);
    char stale[256], live[256], file[300];
    snprintf(stale, sizeof stale, "/dev/shm/corefit-commit-%d-Ab3xYz", (int)dead);
    snprintf(live, sizeof live, "/dev/shm/corefit-commit-%d-Ab3xYz", (int)getpid());
    const char *dirs[] = {stale, live};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(mkdir(dirs[i], 0700), 0);
        snprintf(file, sizeof file, "%s/commit.ckpt", dirs[i]);
        FILE *f = fopen(file, "w");
        assert_non_null(f);
        fputs("a commit", f);
        fclose(f);
    }
    oracle dir;
    oracle_init(&dir);
    int rc = test_cli_run(dir.dir, "train --limit 300 --bs 32 --epochs 1 --quiet --cores 2 "
                                   "--max-restarts 1 --out m.safetensors");
    bool stale_left = stat(stale, &sb) == 0, live_left = stat(live, &sb) == 0;
    snprintf(file, sizeof file, "%s/commit.ckpt", live);
    unlink(file);
    rmdir(live);
    if (stale_left) {
        snprintf(file, sizeof file, "%s/commit.ckpt", stale);
        unlink(file);
        rmdir(stale);
    }
    if (rc != 0) fail_msg("exit %d: %s", rc, err_of(dir.dir));
    if (stale_left) fail_msg("%s (owner %d is gone) was not removed", stale, (int)dead);
    if (!live_left) fail_msg("%s (owner alive) was removed", live);
    oracle_cleanup(&dir);
}

/* ---- 5. resume with logging options; 6. crafted checkpoints; 7. NaN pretrained ------------ */

#define FIT_ARGS SMALL " --cores 1 --checkpoint-every 3 --checkpoint ck.ckpt"

/* Rewrites the u64 or f64 at byte `at` of the checkpoint in into out, with a valid CRC. */
static void craft(const char *dir, const char *out, size_t at, const void *value) {
    size_t n = 0;
    unsigned char *b = (unsigned char *)test_read_in(dir, "ck.ckpt", &n);
    assert_non_null(b);
    assert_true(n > at + 8 + 4);
    memcpy(b + at, value, 8);
    uint32_t crc = (uint32_t)crc32(0L, b, (uInt)(n - 4));
    memcpy(b + n - 4, &crc, 4);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, out);
    assert_int_equal(cf_write_file_atomic(path, b, n), CF_OK);
    cf_free(b);
}

/* A fit without logging options that keeps its checkpoint (named), and its model a.safetensors. */
static void fit_with_checkpoint(oracle *dir) {
    need_data();
    oracle_init(dir);
    int rc = test_cli_run(dir->dir, FIT_ARGS " --out a.safetensors");
    if (rc != 0) fail_msg("the fit: exit %d: %s", rc, err_of(dir->dir));
    assert_true(exists(dir->dir, "ck.ckpt"));
}

static void test_resume_takes_logging_options(void **state) {
    (void)state;
    oracle dir;
    fit_with_checkpoint(&dir);
    /* --quiet (in FIT_ARGS: the fit had it too), a CSV log and per-epoch saves only show or
     * record: the resume goes on and ends with the same model */
    int rc = test_cli_run(dir.dir, FIT_ARGS " --out b.safetensors --csv-log log.csv "
                                            "--save-every-epoch --resume ck.ckpt");
    if (rc != 0) fail_msg("resume with logging options: exit %d: %s", rc, err_of(dir.dir));
    assert_true(same_file(dir.dir, "a.safetensors", "b.safetensors"));
    assert_true(exists(dir.dir, "log.csv"));
    /* an option that changes the result is refused by name */
    rc = test_cli_run(dir.dir, FIT_ARGS " --out c.safetensors --wd 0.5 --resume ck.ckpt");
    if (rc == 0 || !strstr(err_of(dir.dir), "wd="))
        fail_msg("resume with --wd: exit %d: %s", rc, err_of(dir.dir));
    oracle_cleanup(&dir);
}

static void test_crafted_checkpoints_are_refused(void **state) {
    (void)state;
    oracle dir;
    fit_with_checkpoint(&dir);
    /* the position and schedule, each crafted with a valid CRC: "CFCK", version, the fit's
     * parameters (length, text), then epoch, next batch, iteration, pct_train */
    size_t n = 0;
    unsigned char *b = (unsigned char *)test_read_in(dir.dir, "ck.ckpt", &n);
    assert_non_null(b);
    uint64_t plen;
    memcpy(&plen, b + 8, 8);
    cf_free(b);
    size_t epoch_at = 16 + (size_t)plen;
    const struct {
        size_t at;
        uint64_t u;
        double d;
        bool is_double;
        const char *says;
    } crafted[] = {
        {epoch_at, 7, 0, false, "epoch 7"},
        {epoch_at + 8, 999, 0, false, "batch 999"},
        {epoch_at + 16, 12345, 0, false, "iteration 12345"},
        {epoch_at + 24, 0, 5.0, true, "pct_train 5"},
    };
    for (size_t i = 0; i < sizeof crafted / sizeof crafted[0]; i++) {
        craft(dir.dir, "bad.ckpt", crafted[i].at,
              crafted[i].is_double ? (const void *)&crafted[i].d : (const void *)&crafted[i].u);
        int rc = test_cli_run(dir.dir, FIT_ARGS " --out x.safetensors --resume bad.ckpt");
        const char *err = err_of(dir.dir);
        if (rc == 0 || !strstr(err, crafted[i].says))
            fail_msg("a checkpoint with %s: exit %d: %s", crafted[i].says, rc, err);
        assert_false(exists(dir.dir, "x.safetensors"));
    }
    oracle_cleanup(&dir);
}

static void test_pretrained_nan_is_refused_on_load(void **state) {
    (void)state;
    oracle dir;
    fit_with_checkpoint(&dir);
    /* a NaN in the body's first tensor */
    size_t m = 0;
    unsigned char *model = (unsigned char *)test_read_in(dir.dir, "a.safetensors", &m);
    assert_non_null(model);
    uint64_t hlen;
    memcpy(&hlen, model, 8);
    char *head = strndup((const char *)model + 8, (size_t)hlen);
    const char *entry = strstr(head, "\"0.0.weight\"");
    assert_non_null(entry);
    const char *offs = strstr(entry, "\"data_offsets\":[");
    assert_non_null(offs);
    size_t off = strtoull(offs + 16, NULL, 10);
    float nan_value = NAN;
    memcpy(model + 8 + hlen + off + 4 * 5, &nan_value, 4);
    free(head);
    char path[4200];
    snprintf(path, sizeof path, "%s/nan.safetensors", dir.dir);
    assert_int_equal(cf_write_file_atomic(path, model, m), CF_OK);
    cf_free(model);
    int rc = test_cli_run(dir.dir, "train --limit 300 --bs 32 --epochs 1 --quiet --cores 1 "
                                   "--pretrained nan.safetensors --out p.safetensors");
    const char *err = err_of(dir.dir);
    if (rc == 0 || !strstr(err, "0.0.weight") || !strstr(err, "NaN"))
        fail_msg("--pretrained with NaN weights: exit %d: %s", rc, err);
    assert_false(exists(dir.dir, "p.safetensors"));
    oracle_cleanup(&dir);
}

int main(void) {
    cf_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_sigterm_keeps_the_fit),
        cmocka_unit_test(test_device_and_fifo_outputs),
        cmocka_unit_test(test_full_disk_checkpoint_warns_and_goes_on),
        cmocka_unit_test(test_stale_commit_directory_is_swept),
        cmocka_unit_test(test_resume_takes_logging_options),
        cmocka_unit_test(test_crafted_checkpoints_are_refused),
        cmocka_unit_test(test_pretrained_nan_is_refused_on_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
