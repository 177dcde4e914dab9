//! The socket intake: listeners accept on the tokio edge; each connection then gets an OS thread
//! that reads scene headers through blocking `Read` and hands each scene to
//! [`Routes::submit`](super::intake::Routes::submit), waiting (and so not reading) while the
//! model's queue is full.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::conn::Conn;
use super::intake::StreamScene;
use super::{DaemonError, Shared, log};
use crate::engine::error_chain;
use crate::source::LineSource;
use crate::source::stream::StreamSource;

/// Permissions of the daemon's Unix sockets: owner and group read and write.
pub const SOCKET_MODE: u32 = 0o660;

/// A bound intake listener.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(std::net::TcpListener),
    /// A Unix socket, removed when the daemon stops.
    Unix(std::os::unix::net::UnixListener, PathBuf),
}

impl Listener {
    /// How the log names it: `tcp ADDR` or `unix PATH`.
    pub fn describe(&self) -> String {
        match self {
            Self::Tcp(l) => match l.local_addr() {
                Ok(a) => format!("tcp {a}"),
                Err(_) => "tcp ?".into(),
            },
            Self::Unix(_, p) => format!("unix {}", p.display()),
        }
    }
}

/// Binds a TCP listener.
pub fn bind_tcp(addr: std::net::SocketAddr) -> Result<Listener, DaemonError> {
    let l = std::net::TcpListener::bind(addr).map_err(|source| DaemonError::Bind {
        what: format!("tcp {addr}"),
        source,
    })?;
    Ok(Listener::Tcp(l))
}

/// Binds a Unix stream socket at `path` with mode 0660. A socket file left by a process that is
/// gone is replaced; one that still answers is an error (another daemon serves it).
pub fn bind_unix(path: &Path) -> Result<std::os::unix::net::UnixListener, DaemonError> {
    let what = format!("unix {}", path.display());
    let err = |source| DaemonError::Bind {
        what: what.clone(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "exists and is not a socket; not replaced",
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "another process is listening on it",
            )));
        }
        std::fs::remove_file(path).map_err(err)?;
    }
    let l = std::os::unix::net::UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(err)?;
    Ok(l)
}

/// Accepts connections on `listener` until the task is aborted, at most `permits` at once (the
/// rest wait in the listen backlog).
pub async fn accept_loop(listener: Listener, shared: Arc<Shared>, permits: Arc<Semaphore>) {
    let described = listener.describe();
    let result = match listener {
        Listener::Tcp(l) => accept_tcp(l, &shared, &permits).await,
        Listener::Unix(l, _) => accept_unix(l, &shared, &permits).await,
    };
    if let Err(e) = result {
        log::event(
            "listener_failed",
            &format!("{described}: {e}; this listener stops"),
            serde_json::json!({"listener": described}),
        );
    }
}

async fn accept_tcp(l: std::net::TcpListener, shared: &Arc<Shared>, permits: &Arc<Semaphore>) -> std::io::Result<()> {
    l.set_nonblocking(true)?;
    let l = tokio::net::TcpListener::from_std(l)?;
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return Ok(());
        };
        let (stream, peer) = match l.accept().await {
            Ok(s) => s,
            Err(e) => {
                transient(&e)?;
                continue;
            }
        };
        let conn = stream.into_std().and_then(|s| {
            s.set_nonblocking(false)?;
            s.set_nodelay(true)?;
            Ok(Conn::Tcp(s))
        });
        spawn_connection(conn, format!("tcp {peer}"), shared.clone(), permit);
    }
}

async fn accept_unix(
    l: std::os::unix::net::UnixListener,
    shared: &Arc<Shared>,
    permits: &Arc<Semaphore>,
) -> std::io::Result<()> {
    let path = l
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        .unwrap_or_default();
    l.set_nonblocking(true)?;
    let l = tokio::net::UnixListener::from_std(l)?;
    let mut n = 0u64;
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return Ok(());
        };
        let stream = match l.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                transient(&e)?;
                continue;
            }
        };
        n += 1;
        let conn = stream.into_std().and_then(|s| {
            s.set_nonblocking(false)?;
            Ok(Conn::Unix(s))
        });
        spawn_connection(conn, format!("unix {} #{n}", path.display()), shared.clone(), permit);
    }
}

/// Accept errors a listener survives (the peer gave up, or descriptors ran out for a moment).
fn transient(e: &std::io::Error) -> std::io::Result<()> {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock => Ok(()),
        _ if e.raw_os_error() == Some(24) || e.raw_os_error() == Some(23) => {
            // EMFILE/ENFILE: back off instead of spinning on the same error.
            std::thread::sleep(std::time::Duration::from_millis(100));
            Ok(())
        }
        _ => Err(std::io::Error::new(e.kind(), e.to_string())),
    }
}

fn spawn_connection(
    conn: std::io::Result<Conn>,
    peer: String,
    shared: Arc<Shared>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let conn = match conn {
        Ok(c) => c,
        Err(e) => {
            log::event(
                "connection_failed",
                &format!("{peer}: {e}"),
                serde_json::json!({"peer": peer}),
            );
            return;
        }
    };
    shared.status.count(|t| t.connections += 1);
    let name = format!("hsiedge-conn-{}", peer.rsplit(['#', ':']).next().unwrap_or(""));
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        serve_connection(conn, &peer, &shared);
        drop(permit);
    });
    if let Err(e) = spawned {
        log::event(
            "connection_failed",
            &format!("starting a connection thread: {e}"),
            serde_json::Value::Null,
        );
    }
}

/// Serves one connection: scene after scene until the peer closes it, a scene is refused or
/// fails, or a drain begins.
fn serve_connection(conn: Conn, peer: &str, shared: &Shared) {
    let handle = match conn.try_clone() {
        Ok(h) => h,
        Err(e) => {
            log::event(
                "connection_failed",
                &format!("{peer}: {e}"),
                serde_json::json!({"peer": peer}),
            );
            return;
        }
    };
    let id = shared.conns.add(handle);
    log::event(
        "connected",
        &format!("{peer}: connected"),
        serde_json::json!({"peer": peer}),
    );
    let mut reader = conn;
    let mut scenes = 0u64;
    let ended = loop {
        if !shared.conns.go_idle(id) {
            break "the daemon is draining";
        }
        let routes = shared.routes();
        if let Err(e) = reader.set_read_timeout(routes.idle_timeout) {
            break refuse(shared, peer, &format!("setting the idle timeout: {e}"));
        }
        let source = match StreamSource::open(reader, peer, routes.limits) {
            Ok(Some(s)) => s,
            Ok(None) => break "closed by the peer",
            Err(e) => break refuse(shared, peer, &error_chain(&e)),
        };
        if !shared.conns.begin_scene(id) {
            break refuse(
                shared,
                peer,
                &format!(
                    "scene `{}`: the daemon is draining; no new scene is accepted",
                    source.info().id
                ),
            );
        }
        // Lines now come as the scene's worker asks for them; a silent sensor fails the scene.
        if let Err(e) = shared.conns.set_read_timeout(id, routes.line_timeout) {
            break refuse(shared, peer, &format!("setting the line timeout: {e}"));
        }
        let (reply, back) = crossbeam_channel::bounded(1);
        if let Err((refusal, _scene)) = routes.submit(Box::new(StreamScene::new(source, reply))) {
            break refuse(shared, peer, &error_chain(&refusal));
        }
        drop(routes);
        scenes += 1;
        match back.recv() {
            Ok(Some(next)) => reader = next,
            _ => break "its scene failed (see scene_failed)",
        }
    };
    shared.conns.remove(id);
    log::event(
        "disconnected",
        &format!("{peer}: connection closed after {scenes} scene(s): {ended}"),
        serde_json::json!({"peer": peer, "scenes": scenes}),
    );
}

/// Logs a refused connection; returns why it ends.
fn refuse(shared: &Shared, peer: &str, error: &str) -> &'static str {
    shared.status.count(|t| t.refused += 1);
    // Errors from the stream name the peer already.
    let msg = if error.starts_with(peer) {
        format!("refused: {error}")
    } else {
        format!("{peer}: refused: {error}")
    };
    log::event("refused", &msg, serde_json::json!({"peer": peer, "error": error}));
    "refused"
}
