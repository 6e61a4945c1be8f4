//! Shared vocabulary of every Silt crate: the error model, object identities and
//! fingerprints, byte-size parsing, the configuration table, metric names and the rate limit
//! of repeated warnings (`log`).

pub mod bufpool;
pub mod clock;
pub mod config;
pub mod error;
pub mod id;
pub mod io;
pub mod log;
pub mod metrics;
pub mod private;
pub mod query;
pub mod secret;
pub mod size;
pub mod sync;
pub mod sys;
pub mod write;

pub use error::{Error, ErrorKind, Result};
pub use id::{ObjectId, PageKey};
