//! Pure logic every side shares, with no I/O: content revisions ([`revision`]), the folder and
//! policy guard evaluated on normalised relative paths ([`guard`]), the one unified-diff
//! parser and strict applier ([`patch`]) with the whole effect of a set of file changes
//! ([`set_effect`]), and the characters of outside text that may not reach a path, a log line
//! or a terminal raw ([`text`]).
//!
//! Must never touch the file system, the network or a clock: callers bring the bytes and the
//! paths, this decides.

pub mod guard;
pub mod patch;
pub mod revision;
pub mod set_effect;
pub mod text;
