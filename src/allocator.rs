//! The allocator: mimalloc instead of glibc's, for resident memory. The caches hold tens of
//! thousands of small allocations per thousand workloads; glibc adds a header and rounding to
//! each (12.4 KiB resident per workload where the caches ask for 9.8) and keeps freed memory
//! in per-thread arenas. mimalloc groups blocks by size without headers (about 10 KiB).
//!
//! mimalloc v2 (the crate's `v2` feature), not v3: after an API server restart, when the
//! caches' worth of objects is allocated and freed at once, v3 kept about 3.5 MiB more
//! resident for good (1,500 workloads), v2 about 1.5.
//!
//! Two options matter:
//! - arena memory is committed as it is used, else freed memory stays resident (22.6 MiB for
//!   1,000 workloads against 14.8). Set where mimalloc is compiled (.cargo/config.toml), since
//!   mimalloc reads it before `main`.
//! - freed memory is handed back at once (`purge_delay` 0, set by `configure`): otherwise
//!   memory a burst freed could stay resident in an operator at rest.
//!
//! The global allocator is declared in `main.rs`, so test binaries keep theirs (tests/heap.rs
//! counts with its own).

use std::ffi::{c_int, c_long};

pub use mimalloc::MiMalloc;

/// mimalloc's option `arena_eager_commit` (its index in `mi_option_t`, mimalloc.h, v2).
#[cfg(test)]
const ARENA_EAGER_COMMIT: c_int = 4;
/// mimalloc's option `purge_delay` (likewise).
const PURGE_DELAY: c_int = 15;

unsafe extern "C" {
    #[cfg(test)]
    fn mi_option_get(option: c_int) -> c_long;
    fn mi_option_set(option: c_int, value: c_long);
}

/// Set the mimalloc options that can be set at run time (see the module): call first in `main`.
pub fn configure() {
    // SAFETY: sets one of mimalloc's options by its index in its own header; takes no pointer.
    unsafe { mi_option_set(PURGE_DELAY, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mimalloc_was_built_to_commit_arenas_as_they_are_used() {
        // SAFETY: reads one of mimalloc's options; takes no pointer.
        let eager = unsafe { mi_option_get(ARENA_EAGER_COMMIT) };
        assert_eq!(
            eager, 0,
            "mimalloc was built without .cargo/config.toml's CFLAGS (or MIMALLOC_ARENA_EAGER_COMMIT is set)"
        );
    }

    #[test]
    fn configured_mimalloc_hands_memory_back_at_once() {
        // SAFETY: reads one of mimalloc's options; takes no pointer.
        let purge_delay = || unsafe { mi_option_get(PURGE_DELAY) };
        assert_eq!(purge_delay(), 10, "mimalloc v2's default: PURGE_DELAY is its index");
        configure();
        assert_eq!(purge_delay(), 0);
    }
}
