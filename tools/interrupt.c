/* Stopping a fit from outside: Ctrl-C (SIGINT) and pre-emption (SIGTERM). */
#include "corefit.h"

/* Set by SIGINT during an in-process fit; the callback below turns it into fastai's
 * CancelFitException at the next batch, so both modes stop the same way. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

static cf_status stop_on_interrupt(cf_callback *cb, cf_learner *learn) {
    (void)cb;
    if (interrupted) cf_learner_cancel(learn, CF_CANCEL_FIT);
    return CF_OK;
}

static cf_callback interrupt_cb = {
    .name = "interrupt", .order = -20, .on = {[CF_EV_AFTER_BATCH] = stop_on_interrupt}};

/* SIGTERM (a pre-empted machine, a batch system's time limit): every fit writes its checkpoint
 * at the next batch boundary and stops (cf_checkpoint_request reaches fork workers too). */
static volatile sig_atomic_t terminated;

static void on_sigterm(int sig) {
    (void)sig;
    terminated = 1;
    cf_checkpoint_request();
}

cf_callback *cli_interrupt_cb(void) {
    return &interrupt_cb;
}

bool cli_interrupted(void) {
    return interrupted;
}

bool cli_terminated(void) {
    return terminated;
}

void cli_catch_sigint(cli_signals *s) {
    struct sigaction sa = {.sa_handler = on_sigint};
    sigemptyset(&sa.sa_mask);
    s->own_sigint = sigaction(SIGINT, &sa, &s->old_sigint) == 0;
}

void cli_catch_sigterm(cli_signals *s) {
    struct sigaction sa = {.sa_handler = on_sigterm};
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    s->own_sigterm = sigaction(SIGTERM, &sa, &s->old_sigterm) == 0;
}

void cli_signals_restore(cli_signals *s) {
    if (s->own_sigint) sigaction(SIGINT, &s->old_sigint, NULL);
    /* after a SIGTERM, more of them (pre-emption repeats it) only stop what is already
     * stopping: the handler stays until exit */
    if (s->own_sigterm && !terminated) sigaction(SIGTERM, &s->old_sigterm, NULL);
    s->own_sigint = s->own_sigterm = false;
}
