/* --show: figures drawn in the terminal as sixel graphics (cf_show_figures: libsixel loaded at
 * run time). COREFIT_SIXEL=1 skips the terminal query (for terminals that draw sixel without
 * saying so); COREFIT_SIXEL=0 turns --show off. */
#include "corefit.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void cli_show_figures(const char *const *paths, int n) {
    const char *env = getenv("COREFIT_SIXEL");
    if (env && strcmp(env, "0") == 0) return;
    if (!isatty(STDOUT_FILENO)) {
        fprintf(stderr, "corefit: --show needs a terminal on stdout; the figures are in the files "
                        "listed above\n");
        return;
    }
    const char *why = cf_show_figures_unavailable(stdout);
    if (why) {
        fprintf(stderr, "corefit: --show: %s; the figures are in the files listed above\n", why);
        return;
    }
    cf_show_figures(paths, n, stdout);
}
