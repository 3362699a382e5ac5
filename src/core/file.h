/* Private to the library: writing a file the one way the library does (src/core/file.c):
 * atomically through a temporary file beside the target, or straight through to a character
 * device. cf_write_file_atomic (corefit/core.h) is the whole-buffer form. */
#ifndef CF_CORE_FILE_H
#define CF_CORE_FILE_H

#include <stdint.h>
#include <sys/types.h>

#include "corefit/core.h"

typedef struct cf__out_file {
    const char *path;
    char *tmp;    /* the temporary file (NULL when writing through) */
    int fd;       /* -1: closed */
    int slot;     /* in the registry of temporary files removed on a fatal signal (-1: none) */
    bool through; /* a character device, written in place */
    mode_t mode;  /* the mode the target gets */
    uint64_t written, total;
} cf__out_file;

/* Opens path for writing: checks it (cf_output_check), removes stale temporary files of the
 * same target, creates and locks the temporary file. `total` is for messages. On failure
 * nothing is left open or on disk. */
cf_status cf__out_open(cf__out_file *f, const char *path, uint64_t total);
/* Writes n bytes; a failure names the path, the cause and the byte (the caller then aborts). */
cf_status cf__out_write(cf__out_file *f, const void *data, size_t n);
/* fsync, rename over the target, the target's mode, close, directory fsync. Closes f either
 * way; on failure the target is unchanged and the temporary file removed. */
cf_status cf__out_commit(cf__out_file *f);
/* Closes f and removes the temporary file (the target is unchanged). */
void cf__out_abort(cf__out_file *f);
/* Removes `<path>.tmp-XXXXXX` files of this user that no process holds locked: what a save
 * killed in the middle left. */
void cf__remove_stale_temporaries(const char *path);
/* The mode a newly created file would get (0666 & ~umask), without touching the umask. */
mode_t cf__new_file_mode(void);
/* fsync of the directory holding path (best effort). */
void cf__fsync_dir_of(const char *path);

#endif
