//! Tests of the training loop.
