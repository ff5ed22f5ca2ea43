//! The IP pool (being written).
