/* --show: figures drawn in the terminal as sixel graphics through libsixel, loaded at run time
 * (dlopen), so corefit neither needs it to build nor to run. COREFIT_SIXEL=1 skips the terminal
 * query (for terminals that draw sixel without saying so); COREFIT_SIXEL=0 turns --show off. */
#include "corefit.h"

#include <dlfcn.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <fcntl.h>
#include <unistd.h>

typedef int (*encoder_new_fn)(void **encoder, void *allocator);
typedef int (*encoder_encode_fn)(void *encoder, const char *filename);
typedef void (*encoder_unref_fn)(void *encoder);

/* Asks the terminal for its primary device attributes (ESC [ c); sixel terminals list 4. */
static bool terminal_has_sixel(void) {
    int fd = open("/dev/tty", O_RDWR | O_NOCTTY);
    if (fd < 0) return false;
    struct termios old, raw;
    if (tcgetattr(fd, &old) != 0) {
        close(fd);
        return false;
    }
    raw = old;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    tcsetattr(fd, TCSANOW, &raw);
    bool sixel = false;
    if (write(fd, "\033[c", 3) == 3) {
        char buf[128];
        size_t n = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        while (n + 1 < sizeof buf && poll(&p, 1, 300) > 0) {
            ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
            if (k <= 0) break;
            n += (size_t)k;
            if (memchr(buf, 'c', n)) break;
        }
        buf[n] = '\0';
        /* ESC [ ? 62 ; 4 ; 6 c */
        char *q = strchr(buf, '?');
        for (char *t = q ? strtok(q + 1, ";c") : NULL; t; t = strtok(NULL, ";c"))
            if (strcmp(t, "4") == 0) sixel = true;
    }
    tcsetattr(fd, TCSANOW, &old);
    close(fd);
    return sixel;
}

void cli_show_figures(const char *const *paths, int n) {
    const char *env = getenv("COREFIT_SIXEL");
    if (env && strcmp(env, "0") == 0) return;
    if (!isatty(STDOUT_FILENO)) {
        fprintf(stderr, "corefit: --show needs a terminal on stdout; the figures are in the files "
                        "listed above\n");
        return;
    }
    void *lib = dlopen("libsixel.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = dlopen("libsixel.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(
            stderr,
            "corefit: --show draws figures with libsixel, which is not installed here\n"
            "  (Debian: apt-get install libsixel1); the figures are in the files listed above\n");
        return;
    }
    encoder_new_fn enc_new = (encoder_new_fn)dlsym(lib, "sixel_encoder_new");
    encoder_encode_fn enc_encode = (encoder_encode_fn)dlsym(lib, "sixel_encoder_encode");
    encoder_unref_fn enc_unref = (encoder_unref_fn)dlsym(lib, "sixel_encoder_unref");
    if (!enc_new || !enc_encode || !enc_unref) {
        fprintf(stderr, "corefit: --show: this libsixel lacks the encoder API\n");
        dlclose(lib);
        return;
    }
    if (!(env && strcmp(env, "1") == 0) && !terminal_has_sixel()) {
        fprintf(stderr, "corefit: --show: this terminal does not report sixel graphics (set "
                        "COREFIT_SIXEL=1 to draw anyway); the figures are in the files listed "
                        "above\n");
        dlclose(lib);
        return;
    }
    for (int i = 0; i < n; i++) {
        void *enc = NULL;
        printf("%s\n", paths[i]);
        fflush(stdout);
        if (enc_new(&enc, NULL) != 0 || !enc) {
            fprintf(stderr, "corefit: --show: libsixel could not start an encoder\n");
            break;
        }
        if (enc_encode(enc, paths[i]) != 0)
            fprintf(stderr, "corefit: --show: libsixel could not draw %s\n", paths[i]);
        enc_unref(enc);
        fflush(stdout);
    }
    dlclose(lib);
}
