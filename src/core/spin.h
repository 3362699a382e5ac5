/* The processor hint for one turn of a spin-wait loop, shared by the thread pool (core/threads.c)
 * and the shared-memory communicator (par/comm_shm.c). */
#ifndef COREFIT_CORE_SPIN_H
#define COREFIT_CORE_SPIN_H

/* Tells the core that this thread is spinning: x86's pause (saves power and leaves the pipeline
 * to the sibling hyper-thread), arm64's yield (the same hint there); nothing elsewhere. */
static inline void cf_spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#endif
