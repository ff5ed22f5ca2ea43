//! In-memory Cloud and Metadata (being written).
