//! `hsiedge subscribe`: a CBOR subscriber (docs/delivery.md) that writes each segment it receives
//! into `OUT/<node>/<scene id>/seg-NNNNNN/` and acknowledges it once the files are on disk.
//! Duplicates (same node and sequence number: a resend) are acknowledged again and not rewritten;
//! `OUT/received.jsonl` records every sequence number received, so a restarted subscriber still
//! recognises them.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::DeliveryError;
use super::message::{self, Ack, MAX_FRAME, Segment};
use super::socket::Stream;
use crate::source::check_scene_id;

/// What `hsiedge subscribe` was asked to do.
#[derive(Debug, Clone)]
pub struct SubscribeOptions {
    /// `IP:PORT` or a Unix socket path.
    pub socket: String,
    /// Where segments are written.
    pub out: PathBuf,
    /// Stop after this many distinct segments.
    pub count: Option<u64>,
    /// How long to keep trying to connect.
    pub connect_timeout: Duration,
}

/// One segment received, as printed (one JSON line each).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Received {
    /// The node.
    pub node: String,
    /// The sequence number.
    pub sequence: u64,
    /// The scene id.
    pub scene_id: String,
    /// The segment number.
    pub segment: u64,
    /// Whether it is the scene's last segment.
    pub last: bool,
    /// Whether it had been received before (then not written again).
    pub duplicate: bool,
    /// Where its files are.
    pub folder: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DeliveryError + '_ {
    move |source| DeliveryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn connect(socket: &str, timeout: Duration) -> Result<Stream, DeliveryError> {
    let deadline = Instant::now() + timeout;
    loop {
        let got = match socket.parse::<SocketAddr>() {
            Ok(a) => TcpStream::connect(a).map(Stream::Tcp),
            Err(_) => UnixStream::connect(socket).map(Stream::Unix),
        };
        match got {
            Ok(s) => return Ok(s),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(source) => {
                return Err(DeliveryError::Socket {
                    what: format!("connecting to {socket}"),
                    source,
                });
            }
        }
    }
}

/// Segment files are written only under names a set holds: plain names, no path.
fn check_file_name(name: &str, what: &str) -> Result<(), DeliveryError> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(DeliveryError::Protocol {
            what: what.to_string(),
            message: format!("file name `{name}` is not a plain file name"),
        })
    }
}

/// Writes `msg`'s files into their folder (each synced, through a temporary name and a rename),
/// and syncs the folders.
fn store(out: &Path, msg: &Segment, what: &str) -> Result<PathBuf, DeliveryError> {
    for id in [&msg.node, &msg.scene_id] {
        check_scene_id(id).map_err(|e| DeliveryError::Protocol {
            what: what.to_string(),
            message: format!("`{id}`: {e}"),
        })?;
    }
    let folder = out
        .join(&msg.node)
        .join(&msg.scene_id)
        .join(format!("seg-{:06}", msg.segment));
    std::fs::create_dir_all(&folder).map_err(io(&folder))?;
    for f in &msg.files {
        check_file_name(&f.name, what)?;
        let tmp = folder.join(format!(".{}.tmp", f.name));
        std::fs::File::create(&tmp)
            .and_then(|mut file| {
                file.write_all(&f.data)?;
                file.sync_all()
            })
            .map_err(io(&tmp))?;
        let to = folder.join(&f.name);
        std::fs::rename(&tmp, &to).map_err(io(&to))?;
    }
    // The segment is acknowledged once it is on disk: its files' names, and the folders made
    // for it, up to `out`.
    let mut dir = Some(folder.as_path());
    while let Some(d) = dir {
        std::fs::File::open(d).and_then(|f| f.sync_all()).map_err(io(d))?;
        dir = d.parent().filter(|p| p.starts_with(out) && d != out);
    }
    Ok(folder)
}

/// Connects and receives segments until the daemon closes the connection or `count` distinct
/// ones have arrived; `seen` is called with each (duplicates included). Returns the distinct count.
pub fn subscribe(opts: &SubscribeOptions, seen: &mut dyn FnMut(&Received)) -> Result<u64, DeliveryError> {
    std::fs::create_dir_all(&opts.out).map_err(io(&opts.out))?;
    let journal = opts.out.join("received.jsonl");
    let mut known: BTreeSet<(String, u64)> = BTreeSet::new();
    if let Ok(text) = std::fs::read_to_string(&journal) {
        for line in text.lines() {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(line)
                && let (Some(n), Some(s)) = (v["node"].as_str(), v["sequence"].as_u64())
            {
                known.insert((n.to_string(), s));
            }
        }
    }
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&journal)
        .map_err(io(&journal))?;
    let mut conn = connect(&opts.socket, opts.connect_timeout)?;
    let what = format!("the daemon at {}", opts.socket);
    let mut distinct = 0u64;
    while opts.count.is_none_or(|c| distinct < c) {
        let Some(body) = message::read_frame(&mut conn, MAX_FRAME, &what)? else {
            break;
        };
        let msg: Segment = message::decode(&body, &what)?;
        drop(body);
        let key = (msg.node.clone(), msg.sequence);
        let duplicate = known.contains(&key);
        let folder = if duplicate {
            opts.out
                .join(&msg.node)
                .join(&msg.scene_id)
                .join(format!("seg-{:06}", msg.segment))
        } else {
            store(&opts.out, &msg, &what)?
        };
        let r = Received {
            node: msg.node.clone(),
            sequence: msg.sequence,
            scene_id: msg.scene_id.clone(),
            segment: msg.segment,
            last: msg.last,
            duplicate,
            folder,
        };
        if !duplicate {
            let line = serde_json::to_string(&r).unwrap_or_default();
            writeln!(log, "{line}").map_err(io(&journal))?;
            log.sync_data().map_err(io(&journal))?;
            known.insert(key);
            distinct += 1;
        }
        seen(&r);
        message::write_frame(&mut conn, &Ack::of(msg.sequence)).map_err(|source| DeliveryError::Socket {
            what: what.clone(),
            source,
        })?;
    }
    Ok(distinct)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::message::{SetFile, VERSION};
    use std::os::unix::net::UnixListener;

    fn segment(seq: u64, data: &[u8]) -> Segment {
        Segment {
            kind: "segment".into(),
            version: VERSION,
            node: "edge-1".into(),
            sequence: seq,
            scene_id: "pass".into(),
            segment: 0,
            first_line: 0,
            lines: 1,
            samples: 2,
            last: true,
            model: "m".into(),
            classes: vec!["a".into()],
            colours: vec![[1, 2, 3]],
            map_info: None,
            coordinate_system: None,
            files: vec![SetFile {
                name: "class_map.img".into(),
                data: data.to_vec(),
            }],
        }
    }

    /// A daemon's side: sends `msgs` in order, each after the previous one's ack; the acks.
    fn serve(l: UnixListener, msgs: Vec<Segment>) -> std::thread::JoinHandle<Vec<u64>> {
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut acks = Vec::new();
            for m in msgs {
                message::write_frame(&mut s, &m).unwrap();
                let body = message::read_frame(&mut s, 1024, "t").unwrap().unwrap();
                acks.push(message::decode::<Ack>(&body, "t").unwrap().sequence);
            }
            acks
        })
    }

    #[test]
    fn a_resend_is_acknowledged_again_but_not_rewritten_and_is_known_after_a_restart() {
        let t = tempfile::tempdir().unwrap();
        let sock = t.path().join("sub.sock");
        let opts = SubscribeOptions {
            socket: sock.to_str().unwrap().into(),
            out: t.path().join("out"),
            count: Some(2),
            connect_timeout: Duration::from_secs(10),
        };
        let l = UnixListener::bind(&sock).unwrap();
        // The resend of 7 carries other bytes here only to show it is not written again.
        let next = Segment {
            segment: 1,
            ..segment(8, b"next")
        };
        let daemon = serve(l, vec![segment(7, b"first"), segment(7, b"resent"), next]);
        let mut seen = Vec::new();
        let n = subscribe(&opts, &mut |r| seen.push((r.sequence, r.duplicate))).unwrap();
        assert_eq!(n, 2);
        assert_eq!(seen, [(7, false), (7, true), (8, false)]);
        assert_eq!(daemon.join().unwrap(), [7, 7, 8]);
        let seg = |n: &str| std::fs::read(opts.out.join("edge-1/pass").join(n).join("class_map.img")).unwrap();
        assert_eq!(
            (seg("seg-000000"), seg("seg-000001")),
            (b"first".to_vec(), b"next".to_vec())
        );
        assert_eq!(
            std::fs::read_to_string(opts.out.join("received.jsonl"))
                .unwrap()
                .lines()
                .count(),
            2
        );

        // Restarted: 8 is known from received.jsonl.
        std::fs::remove_file(&sock).unwrap();
        let l = UnixListener::bind(&sock).unwrap();
        let daemon = serve(l, vec![segment(8, b"again"), segment(9, b"new")]);
        let mut seen = Vec::new();
        let opts = SubscribeOptions { count: Some(1), ..opts };
        subscribe(&opts, &mut |r| seen.push((r.sequence, r.duplicate))).unwrap();
        assert_eq!(seen, [(8, true), (9, false)]);
        assert_eq!(daemon.join().unwrap(), [8, 9]);
    }

    #[test]
    fn a_file_name_with_a_path_is_refused_before_anything_is_written() {
        let t = tempfile::tempdir().unwrap();
        let sock = t.path().join("sub.sock");
        let l = UnixListener::bind(&sock).unwrap();
        let mut bad = segment(1, b"x");
        bad.files[0].name = "../escape".into();
        let daemon = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            message::write_frame(&mut s, &bad).unwrap();
        });
        let opts = SubscribeOptions {
            socket: sock.to_str().unwrap().into(),
            out: t.path().join("out"),
            count: None,
            connect_timeout: Duration::from_secs(10),
        };
        let err = subscribe(&opts, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("../escape"), "{err}");
        assert!(!t.path().join("escape").exists());
        daemon.join().unwrap();
    }
}
