/* Files: the bounded reader (cf_read_file) and the one way the library writes a file
 * (cf__out_*, cf_write_file_atomic): a temporary file next to the target (mkostemp: O_EXCL, mode
 * 0600), fsync'd and renamed over the target, then the directory fsync'd; on any failure the
 * temporary file is removed and the target is left as it was. While it is written, the
 * temporary file is locked (flock) and SIGINT, SIGTERM and SIGHUP, when they would end the
 * process, remove it first; one left by a process that could not clean up (SIGKILL, a power
 * cut) is unlocked, and the next save to the same target removes it. A target that is a
 * character device (/dev/null) is written through; a FIFO, a socket or a block device is
 * refused (cf_output_check). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkostemp */
#endif
#include "core/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the bounded file reader --------------------------------------------------------------- */

#define FIFO_WAIT_MS 10000
/* A stream's size is unknown until its end: more than this is refused whatever the caller's
 * limit (a device like /dev/zero never ends; a larger input can be saved to a file first). */
#define STREAM_MAX ((size_t)1 << 30)

static cf_status read_fd(int fd, const char *path, unsigned char *buf, size_t want, size_t *got) {
    *got = 0;
    while (*got < want) {
        ssize_t r = read(fd, buf + *got, want - *got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0)
            return cf_fail(CF_ERR_IO, "reading %s at byte %zu: %s", path, *got, strerror(errno));
        if (r == 0) break;
        *got += (size_t)r;
    }
    return CF_OK;
}

/* A regular file: its size is known, so the check comes before the one allocation. */
static cf_status read_regular(int fd, const char *path, const struct stat *sb, size_t max_bytes,
                              void **data, size_t *size) {
    if ((uint64_t)sb->st_size > (uint64_t)max_bytes)
        return cf_fail(CF_ERR_FORMAT, "%s: file of %lld bytes refused (limit %zu)", path,
                       (long long)sb->st_size, max_bytes);
    size_t n = (size_t)sb->st_size;
    cf_status st = cf_memory_check((uint64_t)n + 1, path);
    if (st != CF_OK) return st;
    unsigned char *buf = cf_malloc(n + 1);
    if (!buf) return cf_fail_context(CF_ERR_NOMEM, "reading %s", path);
    size_t got;
    if ((st = read_fd(fd, path, buf, n, &got)) == CF_OK && got != n)
        st = cf_fail(CF_ERR_IO, "%s shrank while being read (%zu of %zu bytes)", path, got, n);
    if (st != CF_OK) {
        cf_free(buf);
        return st;
    }
    buf[n] = '\0';
    *data = buf;
    *size = n;
    return CF_OK;
}

/* A stream (pipe, FIFO, device): read until its end, refused past max_bytes. */
static cf_status read_stream(int fd, const char *path, bool fifo, size_t max_bytes, void **data,
                             size_t *size) {
    if (fifo) {
        /* Opened without blocking: wait a while for a writer instead of for ever. (Linux
         * reports no event on a FIFO that never had a writer.) */
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r;
        while ((r = poll(&p, 1, FIFO_WAIT_MS)) < 0 && errno == EINTR) {
        }
        if (r == 0)
            return cf_fail(CF_ERR_IO, "%s: a FIFO that no writer opened within %d s", path,
                           FIFO_WAIT_MS / 1000);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    if (max_bytes > STREAM_MAX) max_bytes = STREAM_MAX;
    size_t cap = 0, len = 0;
    unsigned char *buf = NULL;
    for (;;) {
        if (len == cap) {
            if (cap > max_bytes) {
                free(buf);
                return cf_fail(CF_ERR_FORMAT,
                               "%s: more than %zu bytes (the limit for this input) from a stream "
                               "that does not end",
                               path, max_bytes);
            }
            size_t next = cap ? cap * 2 : 65536;
            if (next > max_bytes + 1) next = max_bytes + 1;
            cf_status st = cf_memory_check(next + 1, path);
            if (st != CF_OK) {
                free(buf);
                return st;
            }
            unsigned char *g = realloc(buf, next + 1);
            if (!g) {
                free(buf);
                return cf_fail(CF_ERR_NOMEM, "reading %s: out of memory at %zu bytes", path, len);
            }
            buf = g;
            cap = next;
        }
        size_t got;
        cf_status st = read_fd(fd, path, buf + len, cap - len, &got);
        if (st != CF_OK) {
            free(buf);
            return st;
        }
        len += got;
        if (len < cap) break; /* the end */
    }
    if (len > max_bytes) {
        free(buf);
        return cf_fail(CF_ERR_FORMAT,
                       "%s: more than %zu bytes (the limit for this input) from a stream that "
                       "does not end",
                       path, max_bytes);
    }
    buf[len] = '\0';
    *data = buf; /* cf_free is free */
    *size = len;
    return CF_OK;
}

cf_status cf_read_file(const char *path, size_t max_bytes, void **data, size_t *size) {
    if (!data || !size || !path) return cf_fail(CF_ERR_INVALID, "cf_read_file: NULL argument");
    *data = NULL;
    *size = 0;
    if (max_bytes > SIZE_MAX / 4) max_bytes = SIZE_MAX / 4;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return cf_fail(CF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    cf_status st;
    if (fstat(fd, &sb) != 0)
        st = cf_fail(CF_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    else if (S_ISDIR(sb.st_mode))
        st = cf_fail(CF_ERR_IO, "%s is a directory, not a file", path);
    else if (S_ISREG(sb.st_mode))
        st = read_regular(fd, path, &sb, max_bytes, data, size);
    else
        st = read_stream(fd, path, S_ISFIFO(sb.st_mode), max_bytes, data, size);
    close(fd);
    return st;
}

/* ---- temporary files: removed on the signals that would end the process, and when stale ---- */

#define TMP_SLOTS 16
static const int cleanup_signals[] = {SIGINT, SIGTERM, SIGHUP};
#define N_CLEANUP_SIGNALS ((int)(sizeof cleanup_signals / sizeof cleanup_signals[0]))
static char tmp_paths[TMP_SLOTS][PATH_MAX];
static volatile sig_atomic_t tmp_used[TMP_SLOTS];
static pthread_mutex_t tmp_lock = PTHREAD_MUTEX_INITIALIZER;
static int tmp_active; /* saves in progress */
static struct sigaction tmp_old[N_CLEANUP_SIGNALS];
static bool tmp_installed[N_CLEANUP_SIGNALS];

/* Installed only over a default disposition (which would end the process): removes the
 * temporary files being written, then ends the process by the same signal. */
static void remove_temporaries_and_die(int sig) {
    for (int i = 0; i < TMP_SLOTS; i++)
        if (tmp_used[i]) unlink(tmp_paths[i]);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    raise(sig); /* delivered when this handler returns */
}

/* Blocks (or unblocks) the cleanup signals in this thread: a temporary file is created and
 * registered, or unregistered and forgotten, with none of them in between. */
static void block_cleanup_signals(bool block, sigset_t *old) {
    if (block) {
        sigset_t set;
        sigemptyset(&set);
        for (int i = 0; i < N_CLEANUP_SIGNALS; i++) sigaddset(&set, cleanup_signals[i]);
        pthread_sigmask(SIG_BLOCK, &set, old);
    } else {
        pthread_sigmask(SIG_SETMASK, old, NULL);
    }
}

/* Registers a temporary file for removal on a signal; returns its slot or -1 (all in use: it
 * is then only removed by the next save). */
static int register_temporary(const char *tmp) {
    if (strlen(tmp) >= PATH_MAX) return -1;
    pthread_mutex_lock(&tmp_lock);
    if (tmp_active++ == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = remove_temporaries_and_die;
        sigemptyset(&sa.sa_mask);
        for (int i = 0; i < N_CLEANUP_SIGNALS; i++) {
            tmp_installed[i] = false;
            if (sigaction(cleanup_signals[i], NULL, &tmp_old[i]) == 0 &&
                !(tmp_old[i].sa_flags & SA_SIGINFO) && tmp_old[i].sa_handler == SIG_DFL)
                tmp_installed[i] = sigaction(cleanup_signals[i], &sa, NULL) == 0;
        }
    }
    int slot = -1;
    for (int i = 0; i < TMP_SLOTS && slot < 0; i++)
        if (!tmp_used[i]) {
            snprintf(tmp_paths[i], PATH_MAX, "%s", tmp);
            tmp_used[i] = 1;
            slot = i;
        }
    pthread_mutex_unlock(&tmp_lock);
    return slot;
}

static void unregister_temporary(int slot) {
    pthread_mutex_lock(&tmp_lock);
    if (slot >= 0) tmp_used[slot] = 0;
    if (--tmp_active == 0)
        for (int i = 0; i < N_CLEANUP_SIGNALS; i++) {
            /* Put back only what is still ours (the caller may have changed it since). */
            struct sigaction now;
            if (tmp_installed[i] && sigaction(cleanup_signals[i], NULL, &now) == 0 &&
                now.sa_handler == remove_temporaries_and_die)
                sigaction(cleanup_signals[i], &tmp_old[i], NULL);
            tmp_installed[i] = false;
        }
    pthread_mutex_unlock(&tmp_lock);
}

/* Creates and locks the temporary file tmp (a mkostemp template, rewritten). A concurrent save
 * to the same target may take a file for stale in the moment between its creation and its lock
 * (cf__remove_stale_temporaries: it locks, then unlinks): a file whose lock is taken, or that has
 * no name any more once locked, is left to it and another one made. -1 with errno on failure. */
static int create_locked_temporary(char *tmp) {
    const size_t len = strlen(tmp);
    for (int attempt = 0; attempt < 16; attempt++) {
        memcpy(tmp + len - 6, "XXXXXX", 6);
        const int fd = mkostemp(tmp, O_CLOEXEC); /* O_CREAT | O_EXCL, mode 0600 */
        if (fd < 0) return -1;
        struct stat sb;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &sb) == 0 && sb.st_nlink > 0)
            return fd; /* in use: not stale (see cf__remove_stale_temporaries) */
        close(fd);
    }
    errno = EBUSY;
    return -1;
}

/* Removes temporary files of the same target (`<name>.tmp-XXXXXX`, ours, regular) that no
 * process has locked: they were left by a save that was killed. A save in progress holds the
 * lock on its own. */
void cf__remove_stale_temporaries(const char *path) {
    char *copy = cf_strdup(path);
    if (!copy) return;
    char *slash = strrchr(copy, '/');
    const char *dir = ".", *base = copy;
    if (slash) {
        *slash = '\0';
        dir = slash == copy ? "/" : copy;
        base = slash + 1;
    }
    size_t blen = strlen(base);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *name = e->d_name;
        if (strlen(name) != blen + 11 || strncmp(name, base, blen) != 0 ||
            strncmp(name + blen, ".tmp-", 5) != 0)
            continue;
        int fd = openat(dirfd(d), name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        struct stat sb;
        if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == geteuid() &&
            flock(fd, LOCK_EX | LOCK_NB) == 0)
            unlinkat(dirfd(d), name, 0);
        close(fd);
    }
    if (d) closedir(d);
    cf_free(copy);
}

static const char *file_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISCHR(mode)) return "a character device";
    return "not a regular file";
}

cf_status cf_output_check(const char *path, bool *write_through) {
    *write_through = false;
    struct stat sb;
    /* (a directory is left to the rename, which fails on it and names it) */
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode) || S_ISDIR(sb.st_mode)) return CF_OK;
    if (S_ISCHR(sb.st_mode)) {
        *write_through = true;
        return CF_OK;
    }
    return cf_fail(CF_ERR_IO,
                   "cannot write %s: it is %s, which a save would replace (corefit writes regular "
                   "files, and writes through to character devices such as /dev/null)",
                   path, file_kind(sb.st_mode));
}

/* The mode a newly created file would get (0666 & ~umask), without touching the umask. */
mode_t cf__new_file_mode(void) {
    mode_t mask = 022;
    FILE *f = fopen("/proc/self/status", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "Umask:", 6) == 0) {
                mask = (mode_t)strtoul(line + 6, NULL, 8) & 0777;
                break;
            }
        fclose(f);
    }
    return 0666 & ~mask;
}

/* ---- writing --------------------------------------------------------------------------- */

cf_status cf__out_write(cf__out_file *f, const void *data, size_t n) {
    const unsigned char *p = data;
    while (n > 0) {
        ssize_t r = write(f->fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int err = r < 0 ? errno : ENOSPC;
            return cf_fail(CF_ERR_IO, "writing %s: %s at byte %llu of %llu (the file is unchanged)",
                           f->path, strerror(err), (unsigned long long)f->written,
                           (unsigned long long)f->total);
        }
        p += r;
        n -= (size_t)r;
        f->written += (uint64_t)r;
    }
    return CF_OK;
}

void cf__fsync_dir_of(const char *path) {
    char *dir = cf_strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir)
        d = "/";
    else if (slash) {
        *slash = '\0';
        d = dir;
    }
    int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    cf_free(dir);
}

static void forget_temporary(cf__out_file *f) {
    if (f->slot < 0) return;
    sigset_t mask;
    block_cleanup_signals(true, &mask);
    unregister_temporary(f->slot);
    block_cleanup_signals(false, &mask);
    f->slot = -1;
}

void cf__out_abort(cf__out_file *f) {
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
    if (f->tmp && f->tmp[0]) unlink(f->tmp);
    forget_temporary(f);
    cf_free(f->tmp);
    f->tmp = NULL;
}

cf_status cf__out_open(cf__out_file *f, const char *path, uint64_t total) {
    *f = (cf__out_file){.path = path, .fd = -1, .slot = -1, .total = total};
    f->mode = cf__new_file_mode();
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) f->mode = sb.st_mode & 07777;
    bool through = false;
    cf_status st = cf_output_check(path, &through);
    if (st != CF_OK) return st;
    if (through) { /* a character device: straight into it */
        f->through = true;
        if ((f->fd = open(path, O_WRONLY | O_CLOEXEC | O_NOCTTY)) < 0)
            return cf_fail(CF_ERR_IO, "writing %s: %s", path, strerror(errno));
        return CF_OK;
    }
    size_t plen = strlen(path);
    if (!(f->tmp = cf_malloc(plen + 16))) return cf_fail_context(CF_ERR_NOMEM, "writing %s", path);
    cf__remove_stale_temporaries(path);
    snprintf(f->tmp, plen + 16, "%s.tmp-XXXXXX", path);
    sigset_t mask;
    block_cleanup_signals(true, &mask);
    f->fd = create_locked_temporary(f->tmp);
    int err = errno;
    if (f->fd >= 0) f->slot = register_temporary(f->tmp);
    block_cleanup_signals(false, &mask);
    if (f->fd < 0) {
        st = cf_fail(CF_ERR_IO, "writing %s: cannot create a temporary file %s: %s", path, f->tmp,
                     strerror(err));
        f->tmp[0] = '\0';
        cf__out_abort(f);
    }
    return st;
}

cf_status cf__out_commit(cf__out_file *f) {
    cf_status st = CF_OK;
    if (f->through) {
        int fd = f->fd;
        f->fd = -1;
        if (close(fd) != 0)
            st = cf_fail(CF_ERR_IO, "writing %s: close failed: %s", f->path, strerror(errno));
        cf__out_abort(f);
        return st;
    }
    if (fsync(f->fd) != 0) {
        st = cf_fail(CF_ERR_IO, "writing %s: fsync failed: %s (the file is unchanged)", f->path,
                     strerror(errno));
        cf__out_abort(f);
        return st;
    }
    if (rename(f->tmp, f->path) != 0) {
        st = cf_fail(CF_ERR_IO, "writing %s: cannot rename %s over it: %s (the file is unchanged)",
                     f->path, f->tmp, strerror(errno));
        cf__out_abort(f);
        return st;
    }
    /* The temporary file stays 0600 until it is the target; only then does it get the target's
     * mode (best effort: it stays 0600 otherwise). */
    forget_temporary(f);
    f->tmp[0] = '\0';
    (void)fchmod(f->fd, f->mode);
    int fd = f->fd;
    f->fd = -1;
    if (close(fd) != 0)
        st = cf_fail(CF_ERR_IO, "writing %s: close failed: %s", f->path, strerror(errno));
    cf__out_abort(f);                           /* frees the name */
    if (st == CF_OK) cf__fsync_dir_of(f->path); /* make the rename durable (best effort) */
    return st;
}

cf_status cf_write_file_atomic(const char *path, const void *data, size_t size) {
    if (!path || !path[0]) return cf_fail(CF_ERR_INVALID, "cf_write_file_atomic: empty path");
    cf__out_file f;
    cf_status st = cf__out_open(&f, path, size);
    if (st == CF_OK && (st = cf__out_write(&f, data, size)) != CF_OK) cf__out_abort(&f);
    if (st == CF_OK) st = cf__out_commit(&f);
    return st;
}
