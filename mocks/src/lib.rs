//! mockcloud
