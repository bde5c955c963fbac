//! Bus connections named in the manifest (`buses:`), owned by the host:
//! plugins only name a connection in a `publish` action.
//!
//! (Skeleton: being filled in. Public API the executors rely on:
//! `Buses::new(&[BusConnection]) -> Buses`, `Buses::publish(..) -> Result<(), PublishError>`,
//! `PublishError::retryable()`.)
#![forbid(unsafe_code)]
