//! The CBOR subscriber sink: the daemon listens on `delivery.subscriber_tcp` or
//! `delivery.subscriber_unix`; a connected subscriber gets the queue's segments one at a time,
//! oldest first, and must acknowledge each by its sequence number (docs/delivery.md). No ack within
//! `delivery.ack_timeout_s`: the segment is sent again on the same connection; the connection
//! gone: it is sent again to the next subscriber. One subscriber is served at a time; others wait
//! in the listen backlog.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::config::{DeliveryConfig, SubscriberAddr};
use super::message::{self, Ack, MAX_ACK_FRAME};
use super::{DeliveryError, Queue};
use crate::daemon::log;
use crate::engine::error_chain;

/// This sink's name in the queue.
pub const SINK: &str = "socket";

/// How often a waiting thread looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// The subscriber listener.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// A Unix socket (its path, removed at the end).
    Unix(UnixListener, std::path::PathBuf),
}

/// A subscriber's connection.
#[derive(Debug)]
pub enum Stream {
    /// TCP.
    Tcp(TcpStream),
    /// Unix.
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

impl Stream {
    fn set_timeouts(&self, read: Duration, write: Duration) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
            Stream::Unix(s) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(read))?;
                s.set_write_timeout(Some(write))
            }
        }
    }
}

/// A description of `addr` for messages.
pub fn describe(addr: &SubscriberAddr) -> String {
    match addr {
        SubscriberAddr::Tcp(a) => format!("tcp {a}"),
        SubscriberAddr::Unix(p) => format!("unix {}", p.display()),
    }
}

/// Binds the subscriber socket (non-blocking accepts, so the sink can stop).
pub fn bind(addr: &SubscriberAddr) -> Result<Listener, DeliveryError> {
    let err = |source| DeliveryError::Socket {
        what: format!("binding the subscriber socket {}", describe(addr)),
        source,
    };
    let l = match addr {
        SubscriberAddr::Tcp(a) => {
            let l = TcpListener::bind(a).map_err(err)?;
            l.set_nonblocking(true).map_err(err)?;
            Listener::Tcp(l)
        }
        SubscriberAddr::Unix(p) => {
            // A socket file left by a killed daemon; anything else at the path is refused by bind.
            if std::fs::symlink_metadata(p).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt;
                m.file_type().is_socket()
            }) {
                let _ = std::fs::remove_file(p);
            }
            let l = UnixListener::bind(p).map_err(err)?;
            l.set_nonblocking(true).map_err(err)?;
            Listener::Unix(l, p.clone())
        }
    };
    let what = match &l {
        Listener::Tcp(t) => t.local_addr().map_or_else(|_| describe(addr), |a| format!("tcp {a}")),
        Listener::Unix(_, p) => format!("unix {}", p.display()),
    };
    log::event(
        "subscriber_socket",
        &format!("CBOR subscribers connect to {what}"),
        serde_json::json!({"subscriber_socket": what}),
    );
    Ok(l)
}

fn accept(l: &Listener) -> std::io::Result<Option<(Stream, String)>> {
    let got = match l {
        Listener::Tcp(t) => t.accept().map(|(s, a)| (Stream::Tcp(s), format!("tcp {a}"))),
        Listener::Unix(u, p) => u
            .accept()
            .map(|(s, _)| (Stream::Unix(s), format!("unix {}", p.display()))),
    };
    match got {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

fn timed_out(e: &DeliveryError) -> bool {
    matches!(e, DeliveryError::Socket { source, .. }
        if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

/// What waiting for an ack ended with.
enum AckWait {
    Acked,
    TimedOut,
    Gone(String),
    Stopped,
}

fn wait_ack(conn: &mut Stream, seq: u64, timeout: Duration, peer: &str, stop: &AtomicBool) -> AckWait {
    let deadline = Instant::now() + timeout;
    loop {
        if stop.load(Ordering::Acquire) {
            return AckWait::Stopped;
        }
        match message::read_frame(conn, MAX_ACK_FRAME, peer) {
            Ok(None) => return AckWait::Gone("the subscriber closed the connection".into()),
            Ok(Some(body)) => match message::decode::<Ack>(&body, peer) {
                Ok(a) if a.sequence == seq => return AckWait::Acked,
                // An ack of an earlier send of another segment (it was resent): ignored.
                Ok(_) => {}
                Err(e) => return AckWait::Gone(error_chain(&e)),
            },
            Err(e) if timed_out(&e) => {
                if Instant::now() >= deadline {
                    return AckWait::TimedOut;
                }
            }
            Err(e) => return AckWait::Gone(error_chain(&e)),
        }
    }
}

/// The sink's loop, until `stop`: accept a subscriber, send it the oldest segment it has not
/// acknowledged, wait for its ack, record it; resend on timeout, re-accept on a lost connection.
pub fn run(listener: Listener, queue: &Queue, config: &DeliveryConfig, stop: &AtomicBool) {
    let mut conn: Option<(Stream, String)> = None;
    while !stop.load(Ordering::Acquire) {
        let Some((stream, peer)) = conn.as_mut() else {
            match accept(&listener) {
                Ok(Some((s, peer))) => match s.set_timeouts(POLL, config.ack_timeout) {
                    Ok(()) => {
                        log::event(
                            "subscriber_connected",
                            &format!("CBOR subscriber connected from {peer}"),
                            serde_json::json!({"peer": peer}),
                        );
                        conn = Some((s, peer));
                    }
                    Err(e) => log::note("subscriber_failed", &format!("{peer}: {e}")),
                },
                Ok(None) => std::thread::sleep(POLL),
                Err(e) => {
                    log::note("subscriber_failed", &format!("accepting a subscriber: {e}"));
                    std::thread::sleep(POLL);
                }
            }
            continue;
        };
        let Some(entry) = queue.next_for(SINK, POLL) else {
            continue;
        };
        let msg = match message::build(&entry, &config.node) {
            Ok(m) => m,
            Err(e) => {
                // The set is unreadable: the entry stays queued (nothing is dropped) and is tried again.
                log::event(
                    "delivery_failed",
                    &format!(
                        "segment {} of scene `{}`: {}",
                        entry.seq,
                        entry.scene_id,
                        error_chain(&e)
                    ),
                    serde_json::json!({"sink": SINK, "sequence": entry.seq}),
                );
                std::thread::sleep(config.ack_timeout.min(Duration::from_secs(5)));
                continue;
            }
        };
        let sent = message::write_frame(stream, &msg);
        drop(msg);
        let outcome = match sent {
            Err(e) => AckWait::Gone(format!("sending: {e}")),
            Ok(()) => wait_ack(stream, entry.seq, config.ack_timeout, peer, stop),
        };
        match outcome {
            AckWait::Acked => {
                if let Err(e) = queue.ack(entry.seq, SINK) {
                    log::event(
                        "delivery_failed",
                        &format!("recording the ack of {}: {}", entry.seq, error_chain(&e)),
                        serde_json::json!({"sink": SINK, "sequence": entry.seq}),
                    );
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            AckWait::TimedOut => log::event(
                "ack_timeout",
                &format!(
                    "{peer}: no ack of segment {} within {:.1} s; sending it again",
                    entry.seq,
                    config.ack_timeout.as_secs_f64()
                ),
                serde_json::json!({"sink": SINK, "sequence": entry.seq, "peer": peer}),
            ),
            AckWait::Gone(why) => {
                log::event(
                    "subscriber_lost",
                    &format!(
                        "{peer}: {why}; segment {} is sent again to the next subscriber",
                        entry.seq
                    ),
                    serde_json::json!({"sink": SINK, "sequence": entry.seq, "peer": peer}),
                );
                conn = None;
            }
            AckWait::Stopped => break,
        }
    }
    if let Listener::Unix(_, p) = &listener {
        let _ = std::fs::remove_file(p);
    }
}
