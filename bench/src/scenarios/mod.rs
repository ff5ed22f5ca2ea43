//! The scenarios of issue 8, one module each.

pub mod cold_burst;
pub mod fleet;
pub mod fragmentation;
pub mod grpc;
pub mod ipam;
pub mod memory;
pub mod netpol;
pub mod soak;
pub mod startup;
pub mod wiring;
