//! Ownership and ACL preservation with real users (filled in by the ownership suite).
