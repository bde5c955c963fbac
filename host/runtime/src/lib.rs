//! Plugin runtime.
