//! Crash and concurrency suites (filled in separately).
