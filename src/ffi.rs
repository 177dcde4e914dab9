//! The crate's only `unsafe` boundary with the operating system: read-only file mappings.
//!
//! ONNX Runtime is reached through the `ort` crate, whose safe API releases its handles in `Drop`;
//! what remains unsafe in hsiedge is mapping a file into memory, and it lives here alone.

use std::fs::File;

/// A read-only mapping of a whole file.
pub type Mapping = memmap2::Mmap;

/// Maps `file` read-only.
///
/// The caller must have checked the file's length against what it will read: the mapping's length is
/// the file's length at the time of the call.
pub fn map_readonly(file: &File) -> std::io::Result<Mapping> {
    // SAFETY: the mapping is read-only and private to this process, so no Rust reference aliases a
    // mutable view. The one hazard is another process truncating or rewriting the file while it is
    // mapped: reads past the new end raise SIGBUS and rewritten bytes change under us. hsiedge's own
    // writers never modify a file in place (they write a temporary file and rename it), sensor spools
    // deliver whole files the same way, and the documented contract of `cube::Cube::open` is that the
    // input is not truncated while a `Cube` lives.
    unsafe { memmap2::MmapOptions::new().map(file) }
}
