//! What the delivery tests share: a real mosquitto on a free loopback port, an MQTT consumer
//! (rumqttc) collecting segments, the `[delivery]` configuration and `hsiedge subscribe`.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hsiedge::delivery::message::Segment;
use rumqttc::{Client, Event, MqttOptions, Packet, QoS};

use crate::common::*;

/// The broker's binary (Debian's `mosquitto`).
pub const MOSQUITTO: &str = "/usr/sbin/mosquitto";

/// Whether mosquitto is installed; outside CI its absence skips (printed), in CI it fails
/// (`.ci/run` installs it).
pub fn have_mosquitto() -> bool {
    if Path::new(MOSQUITTO).is_file() {
        return true;
    }
    assert!(
        std::env::var("CI").is_err(),
        "CI must have {MOSQUITTO} (.ci/run installs Debian's mosquitto)"
    );
    skip(format!("{MOSQUITTO} is not installed (apt-get install mosquitto)"));
    false
}

/// A free loopback TCP port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A mosquitto process on `port`, persistent (its sessions survive a restart), killed on drop.
pub struct Broker {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Broker {
    pub fn start(dir: &Path) -> Self {
        Self::start_on(dir, free_port())
    }

    pub fn start_on(dir: &Path, port: u16) -> Self {
        let mut b = Self {
            port,
            dir: dir.to_path_buf(),
            child: None,
        };
        b.restart();
        b
    }

    /// Starts it (again) on its port and waits until it accepts connections.
    pub fn restart(&mut self) {
        std::fs::create_dir_all(&self.dir).unwrap();
        let conf = self.dir.join("mosquitto.conf");
        std::fs::write(
            &conf,
            format!(
                // `user root`: run as root, mosquitto would otherwise drop to its own user, which
                // cannot write the persistence file into the test's private folder.
                "listener {} 127.0.0.1\nallow_anonymous true\nuser root\npersistence true\npersistence_location {}/\n",
                self.port,
                self.dir.display()
            ),
        )
        .unwrap();
        let child = std::process::Command::new(MOSQUITTO)
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mosquitto");
        self.child = Some(child);
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(10), "mosquitto did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it with SIGTERM (it saves its sessions) and waits for the exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = std::process::Command::new("kill").arg(c.id().to_string()).status();
            let _ = c.wait();
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An MQTT consumer collecting every segment it receives (duplicates included), in order.
pub struct Consumer {
    pub got: Arc<Mutex<Vec<Segment>>>,
    pub status: Arc<Mutex<Vec<(String, String)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Consumer {
    /// Subscribes `filter` (and the status topics) as `id`, with a persistent session; returns
    /// once the subscription is acknowledged.
    pub fn start(port: u16, id: &str, filter: &str) -> Self {
        let got = Arc::new(Mutex::new(Vec::new()));
        let status = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (g, st, s, filter, id) = (
            got.clone(),
            status.clone(),
            stop.clone(),
            filter.to_string(),
            id.to_string(),
        );
        let thread = std::thread::spawn(move || {
            let mut opts = MqttOptions::new(id, "127.0.0.1", port);
            opts.set_keep_alive(Duration::from_secs(5));
            opts.set_clean_session(false);
            opts.set_max_packet_size(256 << 20, 64 << 10);
            let (client, mut conn) = Client::new(opts, 16);
            while !s.load(Ordering::Acquire) {
                match conn.recv_timeout(Duration::from_millis(100)) {
                    Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => {
                        client.subscribe(filter.as_str(), QoS::AtLeastOnce).unwrap();
                        client.subscribe("hsiedge/+/status", QoS::AtLeastOnce).unwrap();
                    }
                    Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => {
                        let _ = ready_tx.send(());
                    }
                    Ok(Ok(Event::Incoming(Packet::Publish(p)))) => {
                        if p.topic.ends_with("/status") {
                            let text = String::from_utf8_lossy(&p.payload).to_string();
                            st.lock().unwrap().push((p.topic.clone(), text));
                        } else {
                            let seg: Segment = ciborium::from_reader(&p.payload[..]).expect("a CBOR segment");
                            assert!(p.topic.ends_with(&format!("/{}/segment", seg.scene_id)), "{}", p.topic);
                            g.lock().unwrap().push(seg);
                        }
                    }
                    // The broker gone: rumqttc reconnects on the next poll.
                    Ok(Err(_)) => std::thread::sleep(Duration::from_millis(100)),
                    _ => {}
                }
            }
        });
        ready_rx.recv_timeout(Duration::from_secs(20)).expect("subscribed");
        Self {
            got,
            status,
            stop,
            thread: Some(thread),
        }
    }

    /// The distinct (node, sequence) received so far.
    pub fn distinct(&self) -> BTreeSet<(String, u64)> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .map(|s| (s.node.clone(), s.sequence))
            .collect()
    }

    /// Waits until `n` distinct segments have arrived.
    pub fn wait_distinct(&self, n: usize, timeout: Duration) {
        let start = Instant::now();
        while self.distinct().len() < n {
            assert!(
                start.elapsed() < timeout,
                "{} of {n} segments within {timeout:?}: {:?}",
                self.distinct().len(),
                self.distinct()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The first segment of `scene`.
    pub fn segment(&self, scene: &str) -> Option<Segment> {
        self.got.lock().unwrap().iter().find(|s| s.scene_id == scene).cloned()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The `[delivery]` tables: node, queue bound, ack timeout, the subscriber socket, the broker.
pub fn delivery_tables(dir: &Path, node: &str, queue_max: usize, socket: bool, broker: Option<&str>) -> String {
    let mut t = format!("[delivery]\nnode = \"{node}\"\nqueue_max = {queue_max}\nack_timeout_s = 1.0\n");
    if socket {
        t.push_str(&format!("subscriber_unix = \"{}/sub.sock\"\n", dir.display()));
    }
    if let Some(b) = broker {
        t.push_str(&format!(
            "[delivery.mqtt]\nbroker = \"{b}\"\nretry_s = 0.2\nkeep_alive_s = 2\n"
        ));
    }
    t
}

/// `hsiedge subscribe` on `dir/sub.sock` until `count` distinct segments; its JSON lines.
pub fn subscribe(dir: &Path, out: &Path, count: usize) -> Vec<serde_json::Value> {
    let o = hsiedge()
        .args(["subscribe", "--socket"])
        .arg(dir.join("sub.sock"))
        .arg("--out")
        .arg(out)
        .args(["--count", &count.to_string(), "--connect-timeout-s", "30"])
        .output()
        .unwrap();
    assert!(o.status.success(), "subscribe: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The bytes of file `name` of `seg`.
pub fn file<'a>(seg: &'a Segment, name: &str) -> &'a [u8] {
    &seg.files
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no {name} in segment {}", seg.sequence))
        .data
}

/// A tmpfs mounted for the test, unmounted on drop.
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` at `at`; `None` (skipped, with the reason) when that is not
    /// possible here: not root, or no mount permission. In CI (root) it must work.
    pub fn mount(at: &std::path::Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).unwrap();
        let root = std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Self(at.to_path_buf())),
            other => {
                let why = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                    Err(e) => e.to_string(),
                };
                assert!(
                    std::env::var("CI").is_err() || !root,
                    "CI runs as root and must be able to mount a tmpfs: {why}"
                );
                skip(format!(
                    "cannot mount a small tmpfs for the outbox (root: {root}): {why}"
                ));
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}
