//! The rnic driver: engine threads, UDP transport on port 4791, and a verbs-shaped
//! Rust API.
//!
//! Not written yet: this crate holds only its place in the workspace. See the
//! README for what is planned and what exists.
