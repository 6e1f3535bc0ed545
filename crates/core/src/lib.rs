//! Pure logic every side shares, with no I/O: content revisions ([`revision`]), the folder and
//! policy guard evaluated on normalised relative paths ([`guard`]), and the one unified-diff
//! parser and strict applier ([`patch`]).
//!
//! Must never touch the file system, the network or a clock: callers bring the bytes and the
//! paths, this decides.

pub mod guard;
pub mod patch;
pub mod revision;
