/*
 * jemalloc's settings for the binaries that link it (the server and the
 * engine benchmarks, which measure what the server would see).  jemalloc
 * reads this string first; MALLOC_CONF in the environment overrides it.
 *
 * muzzy_decay_ms:-1.  Freed pages are still given back to the kernel
 * after dirty_decay_ms (10 s), but with MADV_FREE only: the kernel takes
 * them when it needs memory, and until then a new allocation reuses them
 * without a page fault.  With jemalloc's default (muzzy_decay_ms:0) the
 * same pages were unmapped with MADV_DONTNEED as they decayed, and a
 * query's blocks and encoded answers, tens of megabytes each, were
 * faulted in and zeroed again by the kernel on every query: a 10,000-cell
 * query on one thread took 190 ms instead of 42 ms, 9,000 page faults
 * each (benchmarks/README.md, "Seventh run").  The cost: the resident
 * size counts those pages until the kernel takes them back; /metrics
 * reports them (ivserve_process_resident_bytes{kind="lazy_free"}).
 */
extern const char *malloc_conf;
const char *malloc_conf = "muzzy_decay_ms:-1";
