//! Router-side tokenization for workers that take token ids.
//!
//! Knows nothing of networking or async runtimes: every call is synchronous and every type is
//! `Send + Sync`, to be shared behind an `Arc`.

pub mod bundle;
pub mod bytelevel;
pub mod error;

pub use error::BundleError;
