//! In-memory Kubernetes API server (see issue 3).
