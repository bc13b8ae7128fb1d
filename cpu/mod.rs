//! CPU backend (placeholder until the CPU issue lands).
