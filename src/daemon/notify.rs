//! systemd's readiness protocol (`sd_notify(3)`): one datagram of `KEY=VALUE` lines to the socket
//! named by `NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). Without that variable
//! (not started by systemd) every call does nothing.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::time::Duration;

use crate::config::{NOTIFY_SOCKET, WATCHDOG_PID, WATCHDOG_USEC};

/// A connection to the service manager, or nothing when there is none.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr, PathBuf)>,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` names (a no-op one without it).
    pub fn from_env() -> std::io::Result<Self> {
        match NOTIFY_SOCKET.path() {
            Some(p) => Self::to(p),
            None => Ok(Self { target: None }),
        }
    }

    /// A notifier sending to `path` (`@name`: the abstract namespace).
    pub fn to(path: PathBuf) -> std::io::Result<Self> {
        let addr = match path.to_str().and_then(|s| s.strip_prefix('@')) {
            Some(name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(name.as_bytes())?
            }
            None => SocketAddr::from_pathname(&path)?,
        };
        Ok(Self {
            target: Some((UnixDatagram::unbound()?, addr, path)),
        })
    }

    /// Whether a service manager listens.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `state` (newline-separated `KEY=VALUE` assignments) in one datagram.
    pub fn send(&self, state: &str) -> std::io::Result<()> {
        let Some((sock, addr, path)) = &self.target else {
            return Ok(());
        };
        let n = sock
            .send_to_addr(state.as_bytes(), addr)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        if n != state.len() {
            return Err(std::io::Error::other(format!(
                "{}: sent {n} of {} bytes",
                path.display(),
                state.len()
            )));
        }
        Ok(())
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) -> std::io::Result<()> {
        self.send(&format!("READY=1\nSTATUS={}", one_line(status)))
    }

    /// `STATUS=...`.
    pub fn status(&self, status: &str) -> std::io::Result<()> {
        self.send(&format!("STATUS={}", one_line(status)))
    }

    /// `WATCHDOG=1`.
    pub fn watchdog(&self) -> std::io::Result<()> {
        self.send("WATCHDOG=1")
    }

    /// `RELOADING=1` before a reload (`READY=1` follows once it is done).
    pub fn reloading(&self) -> std::io::Result<()> {
        self.send("RELOADING=1")
    }

    /// `STOPPING=1` with a status line.
    pub fn stopping(&self, status: &str) -> std::io::Result<()> {
        self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)))
    }
}

/// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, when it is set for this process
/// (`WATCHDOG_PID` absent or equal to our pid).
pub fn watchdog_interval() -> Option<Duration> {
    watchdog_interval_from(
        WATCHDOG_USEC.get().as_deref(),
        WATCHDOG_PID.get().as_deref(),
        std::process::id(),
    )
}

fn watchdog_interval_from(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec = usec?.trim().parse::<u64>().ok().filter(|&u| u > 0)?;
    if let Some(p) = pid
        && p.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    Some(Duration::from_micros(usec / 2))
}

/// A status fits on one line of the protocol.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_as_single_datagrams_at_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let rx = UnixDatagram::bind(&path).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = Notifier::to(path).unwrap();
        assert!(n.enabled());
        let mut buf = [0u8; 512];
        let mut recv = || {
            let k = rx.recv(&mut buf).unwrap();
            String::from_utf8(buf[..k].to_vec()).unwrap()
        };
        n.ready("serving 2 models\nover tcp").unwrap();
        assert_eq!(recv(), "READY=1\nSTATUS=serving 2 models over tcp");
        n.watchdog().unwrap();
        assert_eq!(recv(), "WATCHDOG=1");
        n.status("1 scene in flight").unwrap();
        assert_eq!(recv(), "STATUS=1 scene in flight");
        n.reloading().unwrap();
        assert_eq!(recv(), "RELOADING=1");
        n.stopping("draining").unwrap();
        assert_eq!(recv(), "STOPPING=1\nSTATUS=draining");
    }

    #[test]
    fn an_abstract_socket_is_reached_by_its_at_name() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("hsiedge-notify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Notifier::to(format!("@{name}").into()).unwrap().watchdog().unwrap();
        let mut buf = [0u8; 64];
        let k = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..k], b"WATCHDOG=1");
    }

    #[test]
    fn without_a_socket_nothing_is_sent_and_nothing_fails() {
        let n = Notifier { target: None };
        assert!(!n.enabled());
        n.ready("x").unwrap();
    }

    #[test]
    fn the_watchdog_runs_at_half_its_period_for_this_process_only() {
        let half = Some(Duration::from_secs(10));
        assert_eq!(watchdog_interval_from(Some("20000000"), None, 7), half);
        assert_eq!(watchdog_interval_from(Some("20000000"), Some("7"), 7), half);
        assert_eq!(watchdog_interval_from(Some("20000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval_from(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval_from(Some("x"), None, 7), None);
        assert_eq!(watchdog_interval_from(None, None, 7), None);
    }
}
