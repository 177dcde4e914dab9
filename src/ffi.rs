//! The crate's only `unsafe` boundary: read-only file mappings, the C allocator's tunables, thread
//! priority, and the one ONNX Runtime call the `ort` crate does not wrap (registering a CPU arena
//! that grows by what is asked, not by powers of two).
//!
//! ONNX Runtime is otherwise reached through the `ort` crate, whose safe API releases its handles in
//! `Drop`; here, status codes become `Result`s and the arena configuration is released in `Drop`.

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

/// Raises the calling thread's nice value by `increment` (Linux threads have their own).
///
/// Lowering a thread's priority needs no privilege; raising it back would, so callers use this
/// only for threads whose work may wait.
pub fn lower_thread_priority(increment: i32) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid has no preconditions and cannot fail.
        let tid = unsafe { libc::gettid() };
        let who = libc::id_t::try_from(tid).map_err(|_| std::io::Error::other("negative thread id"))?;
        // SAFETY: getpriority/setpriority read and change a scheduling attribute of this thread
        // only; errno is cleared first because -1 is a valid nice value.
        unsafe {
            *libc::__errno_location() = 0;
            let now = libc::getpriority(libc::PRIO_PROCESS, who);
            if now == -1 && *libc::__errno_location() != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setpriority(libc::PRIO_PROCESS, who, (now + increment).min(19)) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = increment;
    Ok(())
}

/// Restores the default action of SIGPIPE (end the process quietly), as a command-line tool
/// piped into `head` expects; Rust's runtime ignores it, which turns a closed pipe into a panic of
/// the next `println!`. Call first thing in `main`; the daemon writes to sockets, and keeps the
/// signal ignored.
pub fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: installing SIG_DFL for SIGPIPE touches no memory of this process; called before any
    // other thread exists, so no thread is inside a write that relies on the ignored signal.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Moves the calling thread to the `SCHED_IDLE` policy: it runs on cores no other thread wants
/// and yields to any thread that wakes (a high nice value still takes a share of a busy core).
/// For housekeeping that may wait indefinitely; needs no privilege.
pub fn idle_thread_policy() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` outlives the call.
        if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPU time the calling thread has used so far (`CLOCK_THREAD_CPUTIME_ID`); `None` where that
/// clock is unavailable. Telemetry measures its own cost with it.
pub fn thread_cpu_time() -> Option<std::time::Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call; the clock id is a
    // constant the kernel knows, and clock_gettime writes nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u32::try_from(ts.tv_nsec).ok()?;
    (rc == 0).then(|| std::time::Duration::new(secs, nanos))
}

/// Bytes an unprivileged writer may still use on the file system holding `path` (`statvfs`:
/// available blocks times the fragment size). The daemon pauses intake while its outbox is short.
pub fn available_bytes(path: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path that outlives the call and `s` points to writable
    // memory of a statvfs, the only thing the call writes.
    let rc = unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `s` (which was zeroed before anyway).
    let s = unsafe { s.assume_init() };
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

/// Ends this process at once with SIGKILL, as `kill -9` from outside would: no destructor, exit
/// handler or buffered write runs. Only the crash tests' failpoints call it.
pub fn kill_self() -> ! {
    #[cfg(unix)]
    // SAFETY: kill with this process's own id and a valid signal number has no memory effects;
    // SIGKILL cannot be caught, so the call does not return when it succeeds.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    std::process::abort()
}

/// An ONNX Runtime call that returned an error status.
#[derive(Debug, thiserror::Error)]
#[error("ONNX Runtime `{call}`: {message}")]
pub struct OrtCallError {
    /// The C API function.
    pub call: &'static str,
    /// ONNX Runtime's message.
    pub message: String,
}

/// Turns an `OrtStatus` into a `Result`, releasing the status.
fn ort_status(call: &'static str, status: ort::sys::OrtStatusPtr) -> Result<(), OrtCallError> {
    if status.0.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: a non-null status returned by the C API is owned by the caller; its message is a
    // NUL-terminated string that lives until the status is released, which happens right after
    // the message is copied.
    let message = unsafe {
        let text = std::ffi::CStr::from_ptr((api.GetErrorMessage)(status.0))
            .to_string_lossy()
            .into_owned();
        (api.ReleaseStatus)(status.0);
        text
    };
    Err(OrtCallError { call, message })
}

/// An `OrtArenaCfg`, released on drop.
struct ArenaCfg(*mut ort::sys::OrtArenaCfg);

impl Drop for ArenaCfg {
    fn drop(&mut self) {
        // SAFETY: the pointer came from CreateArenaCfgV2, is non-null and released exactly once.
        unsafe { (ort::api().ReleaseArenaCfg)(self.0) }
    }
}

/// Registers with `env` a shared CPU arena that extends by exactly what is requested
/// (`kSameAsRequested`); sessions built with `session.use_env_allocators = 1` allocate from it.
///
/// The default arena rounds every extension up to a power of two, so its footprint is a step
/// function of the batch and up to twice the need; without any arena every run's large blocks are
/// fresh mappings the kernel faults and zeroes page by page. This one holds what the largest run
/// needed and reuses it.
pub fn register_cpu_arena(env: &ort::environment::Environment) -> Result<(), OrtCallError> {
    use ort::AsPointer;
    let api = ort::api();
    let keys = [c"arena_extend_strategy".as_ptr(), c"max_mem".as_ptr()];
    // 1 = kSameAsRequested; max_mem 0 lets ONNX Runtime pick (no cap: the memory plan caps the batch).
    let values: [usize; 2] = [1, 0];
    let mut raw = std::ptr::null_mut();
    // SAFETY: keys and values are arrays of the stated length that outlive the call; `raw` receives
    // an owned configuration on success, wrapped at once so it is released in Drop.
    ort_status("CreateArenaCfgV2", unsafe {
        (api.CreateArenaCfgV2)(keys.as_ptr(), values.as_ptr(), keys.len(), &mut raw)
    })?;
    let cfg = ArenaCfg(raw);
    let info = ort::memory::MemoryInfo::new(
        ort::memory::AllocationDevice::CPU,
        0,
        ort::memory::AllocatorType::Arena,
        ort::memory::MemoryType::Default,
    )
    .map_err(|e| OrtCallError {
        call: "CreateMemoryInfo",
        message: e.to_string(),
    })?;
    // SAFETY: env and info are live handles owned by safe wrappers that outlive the call; ONNX
    // Runtime copies the configuration, so `cfg` may be released afterwards.
    ort_status("CreateAndRegisterAllocator", unsafe {
        (api.CreateAndRegisterAllocator)(env.ptr().cast_mut(), info.ptr(), cfg.0)
    })
}
