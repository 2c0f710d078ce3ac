//! Placeholder: the test API server and the local Job runner.
