//! The crate's only `unsafe` boundary with the operating system: read-only file mappings and the
//! C allocator's tunables.
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

/// Pins glibc's allocator so that every block of 256 KiB or more is its own mapping, returned to
/// the system when freed.
///
/// glibc otherwise raises its mmap threshold after the first large free and serves later large
/// blocks from heaps it trims lazily, so freed batch and line buffers stay resident: a long run's
/// memory then drifts tens of MiB above what the memory plan predicts. Call once, first thing in
/// `main`, before other threads start. Elsewhere than glibc it does nothing.
pub fn pin_allocator_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const THRESHOLD: libc::c_int = 256 * 1024;
        // SAFETY: mallopt only changes allocator tunables; it is called before any other thread
        // exists, so no allocation runs concurrently with the change. Its return value says
        // whether the tunable was accepted; on refusal glibc's defaults simply stay in force.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD);
            libc::mallopt(libc::M_TRIM_THRESHOLD, THRESHOLD);
        }
    }
}
