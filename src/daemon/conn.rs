//! Sensor connections: a TCP or Unix stream read through blocking `Read` on the thread that runs
//! the scene, and the registry a drain uses to wake connections waiting between scenes.

use std::collections::BTreeMap;
use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::Duration;

/// One accepted connection.
#[derive(Debug)]
pub enum Conn {
    /// From the TCP listener.
    Tcp(TcpStream),
    /// From the Unix listener.
    Unix(UnixStream),
}

impl Conn {
    /// Another handle to the same socket (for timeouts and shutdown from other threads).
    pub fn try_clone(&self) -> std::io::Result<Self> {
        Ok(match self {
            Self::Tcp(s) => Self::Tcp(s.try_clone()?),
            Self::Unix(s) => Self::Unix(s.try_clone()?),
        })
    }

    /// Sets how long one read may wait (`None`: forever).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s.set_read_timeout(t),
            Self::Unix(s) => s.set_read_timeout(t),
        }
    }

    /// Shuts the socket down in direction `how`; a read blocked on it returns at once.
    pub fn shutdown(&self, how: Shutdown) -> std::io::Result<()> {
        match self {
            Self::Tcp(s) => s.shutdown(how),
            Self::Unix(s) => s.shutdown(how),
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

/// Where a connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Waiting for a scene message (between scenes): a drain closes it.
    Idle,
    /// A scene's header came: the scene is in flight (queued or running) and a drain lets it end.
    InScene,
}

/// The open connections, each with a handle to shut it down.
#[derive(Debug, Default)]
pub struct Connections {
    inner: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    next: u64,
    draining: bool,
    open: BTreeMap<u64, (Conn, ConnState)>,
}

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Registers `handle` (a clone of the connection) as idle; its id.
    pub fn add(&self, handle: Conn) -> u64 {
        let mut r = self.lock();
        r.next += 1;
        let id = r.next;
        r.open.insert(id, (handle, ConnState::Idle));
        id
    }

    /// Marks connection `id` idle before it waits for a scene; `false` once a drain has begun
    /// (the connection must close instead). Checked and set together, so a drain either sees the
    /// connection idle and wakes it, or the connection sees the drain.
    pub fn go_idle(&self, id: u64) -> bool {
        let mut r = self.lock();
        if r.draining {
            return false;
        }
        if let Some(e) = r.open.get_mut(&id) {
            e.1 = ConnState::Idle;
        }
        true
    }

    /// Marks connection `id` as carrying a scene; `false` once a drain has begun (the scene is
    /// refused).
    pub fn begin_scene(&self, id: u64) -> bool {
        let mut r = self.lock();
        if r.draining {
            return false;
        }
        if let Some(e) = r.open.get_mut(&id) {
            e.1 = ConnState::InScene;
        }
        true
    }

    /// Sets how long a read of connection `id` may wait, whichever thread reads it.
    pub fn set_read_timeout(&self, id: u64, t: Option<Duration>) -> std::io::Result<()> {
        match self.lock().open.get(&id) {
            Some((conn, _)) => conn.set_read_timeout(t),
            None => Ok(()),
        }
    }

    /// Forgets connection `id`.
    pub fn remove(&self, id: u64) {
        self.lock().open.remove(&id);
    }

    /// Connections open.
    pub fn len(&self) -> usize {
        self.lock().open.len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Begins a drain: no connection starts another scene, and those waiting between scenes are
    /// woken (their read returns end of stream) so they close.
    pub fn drain(&self) {
        let mut r = self.lock();
        r.draining = true;
        for (conn, state) in r.open.values() {
            if *state == ConnState::Idle {
                let _ = conn.shutdown(Shutdown::Read);
            }
        }
    }

    /// Cuts every connection, scenes in flight included (their reads fail at once).
    pub fn cut_all(&self) -> usize {
        let r = self.lock();
        for (conn, _) in r.open.values() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        r.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_wakes_idle_connections_and_spares_scenes_in_flight() {
        let (a, a_peer) = UnixStream::pair().unwrap();
        let (b, mut b_peer) = UnixStream::pair().unwrap();
        let reg = Connections::default();
        let ia = reg.add(Conn::Unix(a.try_clone().unwrap()));
        let ib = reg.add(Conn::Unix(b.try_clone().unwrap()));
        assert!(reg.begin_scene(ib));
        reg.drain();
        // The idle one reads end of stream at once; the one in a scene still reads its data.
        let mut buf = [0u8; 1];
        assert_eq!(Conn::Unix(a).read(&mut buf).unwrap(), 0);
        std::io::Write::write_all(&mut b_peer, b"x").unwrap();
        assert_eq!(Conn::Unix(b.try_clone().unwrap()).read(&mut buf).unwrap(), 1);
        assert!(!reg.go_idle(ib) && !reg.begin_scene(ia));
        assert_eq!(reg.cut_all(), 2);
        assert_eq!(Conn::Unix(b).read(&mut buf).unwrap(), 0);
        reg.remove(ia);
        reg.remove(ib);
        assert!(reg.is_empty());
        drop((a_peer, b_peer));
    }
}
