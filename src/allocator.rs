//! The allocator: mimalloc instead of glibc's, for resident memory. The operator keeps tens of
//! thousands of small strings, vectors and tables per thousand workloads in its caches, and
//! glibc adds a header and rounding to each (about a quarter on top of what the caches ask
//! for: 12.4 KiB resident per workload where they ask for 9.8), keeps what a burst frees in
//! per-thread arenas, and hands back only whole free pages. mimalloc keeps blocks of each size
//! together without headers (9.6 to 10.6 KiB resident per workload for the same caches) and
//! hands back what a burst freed by itself, shortly after.
//!
//! Its one option that matters here, that an arena's memory is committed as it is used, is set
//! where it is compiled (.cargo/config.toml): mimalloc reads its options as the process starts,
//! before `main`. Committed at once, what it frees is only reset and stays resident (22.6 MiB
//! for 1,000 workloads' caches, against 14.8). The global allocator itself is declared in
//! `main.rs`, the binary's own, so that test binaries keep theirs (tests/heap.rs counts with
//! its own).

pub use mimalloc::MiMalloc;

/// mimalloc's option `arena_eager_commit` (its index in `mi_option_t`, mimalloc.h, v3).
#[cfg(test)]
const ARENA_EAGER_COMMIT: std::ffi::c_int = 4;

#[cfg(test)]
unsafe extern "C" {
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
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
}
