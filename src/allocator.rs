//! The allocator: mimalloc instead of glibc's, for resident memory. The operator keeps tens of
//! thousands of small strings, vectors and tables per thousand workloads in its caches, and
//! glibc adds a header and rounding to each (about a quarter on top of what the caches ask
//! for: 12.4 KiB resident per workload where they ask for 9.8), keeps what a burst frees in
//! per-thread arenas, and hands back only whole free pages. mimalloc keeps blocks of each size
//! together without headers (9.6 to 10.6 KiB resident per workload for the same caches).
//!
//! The line is mimalloc v2 (the crate's `v2` feature), not v3, the crate's default: after an
//! API server restart, whose re-lists and reconciles allocate and free the caches' worth of
//! objects at once, v3 kept about 3.5 MiB more resident for good (1,500 workloads: 29.8 MiB
//! before the first restart, 33.4 to 34.2 after each; the objects themselves grew by 0.7 MiB),
//! v2 about 1.5 (30.1, then 31.2 to 32.2), at the same resident size before it (release
//! build, 2026-12-05).
//!
//! Two of its options matter here:
//! - that an arena's memory is committed as it is used. It is set where mimalloc is compiled
//!   (.cargo/config.toml), since mimalloc reads it as the process starts, before `main`.
//!   Committed at once, what it frees is only reset and stays resident (22.6 MiB for 1,000
//!   workloads' caches, against 14.8).
//! - that memory freed whole is handed back at once (`purge_delay` 0, set by `configure`; it is
//!   read at every purge). mimalloc waits first (10 ms in v2, 1 s in v3), and v3 then hands
//!   it back only when it next takes memory for itself: an operator at rest takes none, so
//!   what a burst had freed (the lists and reconciles after an API server restart) stayed
//!   resident for good. With 1,500 workloads and the API server restarted every 90 s, the
//!   RSS settled at 36 to 40 MiB between restarts, with peaks of 45 MiB; with the purge at
//!   once, at 33 to 35 MiB, peaks included (release build, v3, 2026-12-04).
//!
//! The global allocator itself is declared in `main.rs`, the binary's own, so that test binaries
//! keep theirs (tests/heap.rs counts with its own).

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

/// Set mimalloc's options that can be set once it runs (see the module): call first in `main`.
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
