//! The command line's parts: shared flags (`args`), the benchmark subcommands (`bench`), and what
//! `classify` and `inspect` print and write (`output`).

pub mod args;
pub mod bench;
pub mod output;
