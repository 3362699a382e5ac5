/* Private to the library: large blocks mapped straight from the kernel (src/core/memory.c).
 *
 * From 32 MiB (where glibc maps anyway), cf_calloc maps fresh anonymous pages, which read as
 * zero, instead of clearing a heap block; cf_free unmaps them. cf__malloc_huge maps from 4 MiB.
 * CF_MAP_MIN_BYTES=n in the environment (a number of bytes, read once) sets both thresholds;
 * under AddressSanitizer both are off unless it is set. Mapped blocks must never reach free()
 * or realloc(). */
#ifndef CF_CORE_MEMORY_H
#define CF_CORE_MEMORY_H

#include <stddef.h>

#include "corefit/core.h"

/* Uninitialised memory as cf_malloc gives (64-byte aligned, NULL with CF_ERR_NOMEM recorded;
 * free with cf_free), for a large long-lived block the caller writes whole, such as a data set
 * read from a file. From the threshold it is mapped 2 MiB-aligned with transparent huge pages
 * asked for (madvise MADV_HUGEPAGE; a hint the kernel may ignore), so that filling it costs one
 * page fault per 2 MiB instead of one per 4 KiB. Pages never written are never backed. */
void *cf__malloc_huge(size_t bytes);

/* Faults [p, p + bytes) in (madvise MADV_POPULATE_WRITE, Linux 5.14 and later) on a helper
 * thread, front to back, while the caller fills the block, so that the kernel's clearing of
 * fresh pages runs beside the caller's work instead of inside its page faults. The memory's
 * content never changes. NULL (nothing started) for a block under 8 MiB, where this process
 * runs one thread (cf_get_num_threads), or where unsupported. */
typedef struct cf__prefault cf__prefault;
cf__prefault *cf__prefault_start(void *p, size_t bytes);
/* Stops the helper after its current 8 MiB piece and waits for it; NULL: nothing. */
void cf__prefault_stop(cf__prefault *pf);

#endif
