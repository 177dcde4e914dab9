//! `hsiedge simulate-sensor`: an ENVI cube replayed as a pushbroom sensor's line stream, paced
//! like one, for tests, demos and field rehearsals.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::file::OpenError;
use super::stream::{Faults, SceneHeader, SendStats, SensorStream};
use super::{FileSource, LineSource, SourceError};

/// Where the stream goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    /// `tcp:HOST:PORT` or `HOST:PORT`.
    Tcp(String),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl std::str::FromStr for Addr {
    type Err = SensorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |message| SensorError::Addr {
            addr: s.escape_debug().to_string(),
            message,
        };
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(bad("no socket path after `unix:`"));
            }
            return Ok(Self::Unix(path.into()));
        }
        let hostport = s.strip_prefix("tcp:").unwrap_or(s);
        match hostport.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(Self::Tcp(hostport.into())),
            _ => Err(bad("expected tcp:HOST:PORT, unix:PATH or HOST:PORT")),
        }
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(a) => write!(f, "tcp:{a}"),
            Self::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

/// What to replay, where and how.
#[derive(Debug, Clone)]
pub struct SensorOptions {
    /// The cube (header or data file); BSQ cubes stream as BIL.
    pub scene: PathBuf,
    /// Lines per second; 0 sends as fast as the receiver takes them.
    pub rate: f64,
    /// The receiver.
    pub addr: Addr,
    /// The scene id (default: the header's file stem); with `repeat > 1`, scene K is `ID-K`.
    pub scene_id: Option<String>,
    /// The model the scene message names.
    pub model: Option<String>,
    /// Faults injected into every scene.
    pub faults: Faults,
    /// Scenes sent one after another on the connection.
    pub repeat: u32,
    /// How long to wait, after the last scene, for the receiver to close the connection.
    pub close_wait: Duration,
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SensorReport {
    /// The receiver.
    pub addr: String,
    /// Lines of the cube.
    pub scene_lines: u64,
    /// Line times elapsed: scenes x lines, dropped lines included.
    pub lines: u64,
    /// What went on the wire.
    pub sent: SendStats,
    /// Seconds from the first message to the last.
    pub elapsed_s: f64,
    /// `lines / elapsed_s`.
    pub lines_per_s: f64,
    /// Whether the receiver closed the connection after the last scene within
    /// [`SensorOptions::close_wait`], as a receiver that read everything does.
    pub confirmed: bool,
}

impl std::fmt::Display for SensorReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.sent;
        write!(
            f,
            "sent {} lines ({} scene(s) of {}; {} line messages, {} dropped, {} duplicated, {} swapped) to {} in {:.3} s ({:.1} lines/s)",
            self.lines,
            s.scenes,
            self.scene_lines,
            s.line_messages,
            s.dropped,
            s.duplicated,
            s.swapped,
            self.addr,
            self.elapsed_s,
            self.lines_per_s
        )
    }
}

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
pub enum SensorError {
    /// The cube could not be opened as a scene.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// Reading the cube's lines, or a scene id.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A rate that is not a pace.
    #[error("--rate {0}: must be a number of lines per second, 0 or more (0: as fast as possible)")]
    Rate(f64),
    /// A fault at a line the scene does not have.
    #[error("--{flag} {line}: the scene has {lines} lines")]
    Fault {
        /// The option.
        flag: &'static str,
        /// The line given.
        line: u64,
        /// Lines in the scene.
        lines: u64,
    },
    /// An address that is neither TCP nor a Unix socket.
    #[error("address `{addr}`: {message}")]
    Addr {
        /// The address as given.
        addr: String,
        /// What is wrong.
        message: &'static str,
    },
    /// The receiver could not be reached.
    #[error("connecting to {addr}")]
    Connect {
        /// The receiver.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing to the receiver failed.
    #[error("{addr}: sending {what}: {}", closed(source))]
    Send {
        /// The receiver.
        addr: String,
        /// What was being sent.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The receiver reset the connection instead of closing it after the last scene.
    #[error("{addr}: the receiver reset the connection after the last scene: it refused the stream (see its log)")]
    Refused {
        /// The receiver.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Names the usual reason of a failed write.
fn closed(e: &std::io::Error) -> &'static str {
    match e.kind() {
        ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => {
            "the receiver closed the connection (it refused the stream or stopped: see its log)"
        }
        _ => "the connection failed",
    }
}

/// A connected stream of either kind.
enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn connect(addr: &Addr) -> std::io::Result<Self> {
        Ok(match addr {
            Addr::Tcp(a) => {
                let s = TcpStream::connect(a.as_str())?;
                // Lines go out as they are read, as a sensor's would: no coalescing delay.
                s.set_nodelay(true)?;
                Self::Tcp(s)
            }
            Addr::Unix(p) => Self::Unix(UnixStream::connect(p)?),
        })
    }

    fn shutdown_write(&self) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s.shutdown(Shutdown::Write),
            Self::Unix(s) => s.shutdown(Shutdown::Write),
        }
    }

    fn set_read_timeout(&self, t: Duration) -> std::io::Result<()> {
        let t = Some(t.max(Duration::from_millis(1)));
        match self {
            Self::Tcp(s) => s.set_read_timeout(t),
            Self::Unix(s) => s.set_read_timeout(t),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Self::Tcp(s) => s.write(buf),
            Self::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s.flush(),
            Self::Unix(s) => s.flush(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Self::Tcp(s) => s.read(buf),
            Self::Unix(s) => s.read(buf),
        }
    }
}

/// The scene ids of a replay: the id alone, or `ID-1` to `ID-N` for several scenes.
fn scene_ids(id: &str, repeat: u32) -> Vec<String> {
    if repeat == 1 {
        vec![id.to_string()]
    } else {
        (1..=repeat).map(|k| format!("{id}-{k}")).collect()
    }
}

/// Replays `opts.scene` to `opts.addr`: everything the options name is checked before connecting.
pub fn simulate_sensor(opts: &SensorOptions) -> Result<SensorReport, SensorError> {
    if !opts.rate.is_finite() || opts.rate < 0.0 {
        return Err(SensorError::Rate(opts.rate));
    }
    let first = FileSource::open(&opts.scene, opts.scene_id.as_deref())?;
    let scene_lines = first.info().lines.unwrap_or(0) as u64;
    for (flag, set) in [
        ("drop", &opts.faults.drop),
        ("duplicate", &opts.faults.duplicate),
        ("swap", &opts.faults.swap),
    ] {
        if let Some(&line) = set.iter().find(|&&l| l >= scene_lines) {
            return Err(SensorError::Fault {
                flag,
                line,
                lines: scene_lines,
            });
        }
    }
    let ids = scene_ids(&first.info().id, opts.repeat.max(1));
    for id in &ids {
        super::check_scene_id(id)?;
    }
    if let Some(m) = &opts.model {
        let mut h = SceneHeader::from_info(first.info());
        h.model = Some(m.clone());
        h.into_info("--model")?;
    }
    drop(first);

    let addr = opts.addr.to_string();
    let conn = Conn::connect(&opts.addr).map_err(|source| SensorError::Connect {
        addr: addr.clone(),
        source,
    })?;
    let mut tx = SensorStream::new(conn, opts.faults.clone());
    let send = |what: String| {
        let addr = addr.clone();
        move |source| SensorError::Send { addr, what, source }
    };
    let start = Instant::now();
    let mut slot = 0u64;
    for id in &ids {
        let mut src = FileSource::open(&opts.scene, Some(id))?;
        let mut header = SceneHeader::from_info(src.info());
        header.model = opts.model.clone();
        tx.begin(&header)
            .map_err(send(format!("the scene message of `{id}`")))?;
        let mut line = vec![0u8; src.info().line_bytes()];
        let mut seq = 0u64;
        while src.next_line(&mut line)?.is_some() {
            slot += 1;
            if opts.rate > 0.0 {
                // A line leaves when its exposure ends: deadlines from the start, so no drift.
                let due = start + Duration::from_secs_f64(slot as f64 / opts.rate);
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
            tx.line(seq, &line)
                .map_err(send(format!("line {seq} of scene `{id}`")))?;
            seq += 1;
        }
        tx.end(seq).map_err(send(format!("the end message of scene `{id}`")))?;
    }
    let elapsed_s = start.elapsed().as_secs_f64();
    let sent = tx.stats();
    let confirmed = wait_for_close(tx.into_inner(), opts.close_wait, &addr)?;
    Ok(SensorReport {
        addr,
        scene_lines,
        lines: slot,
        sent,
        elapsed_s,
        lines_per_s: if elapsed_s > 0.0 { slot as f64 / elapsed_s } else { 0.0 },
        confirmed,
    })
}

/// Closes the sending side and waits up to `wait` for the receiver to close its side, as one
/// that read every scene does; a reset means it refused something. Whatever it sends is ignored.
fn wait_for_close(mut conn: Conn, wait: Duration, addr: &str) -> Result<bool, SensorError> {
    let refused = |source| SensorError::Refused {
        addr: addr.to_string(),
        source,
    };
    conn.shutdown_write().map_err(refused)?;
    let deadline = Instant::now() + wait;
    let mut sink = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        conn.set_read_timeout(left).map_err(refused)?;
        match conn.read(&mut sink) {
            Ok(0) => return Ok(true),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Ok(false),
            Err(e) => return Err(refused(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_of_both_kinds_parse_and_others_are_refused() {
        let p = |s: &str| s.parse::<Addr>();
        assert_eq!(p("tcp:127.0.0.1:5555").unwrap(), Addr::Tcp("127.0.0.1:5555".into()));
        assert_eq!(p("localhost:80").unwrap(), Addr::Tcp("localhost:80".into()));
        assert_eq!(p("tcp:[::1]:9").unwrap(), Addr::Tcp("[::1]:9".into()));
        assert_eq!(p("unix:/run/h.sock").unwrap(), Addr::Unix("/run/h.sock".into()));
        assert_eq!(p("unix:/run/h.sock").unwrap().to_string(), "unix:/run/h.sock");
        for bad in [
            "",
            "unix:",
            "tcp:host",
            "host:port",
            ":80",
            "tcp:h:70000",
            "/run/h.sock",
        ] {
            let e = p(bad).unwrap_err().to_string();
            assert!(e.starts_with("address `"), "{bad}: {e}");
        }
    }

    #[test]
    fn repeated_scenes_get_numbered_ids() {
        assert_eq!(scene_ids("s", 1), ["s"]);
        assert_eq!(scene_ids("s", 3), ["s-1", "s-2", "s-3"]);
    }
}
