//! The MQTT sink (`rumqttc`, MQTT 3.1.1): each queued segment is published at QoS 1 on
//! `hsiedge/<node>/<scene id>/segment` (the CBOR message of docs/delivery.md, sequence number
//! inside) and acknowledged in the queue when the broker's PUBACK for it arrives. One publish is
//! in flight at a time, so segments reach the broker in queue order. Any connection error, or no
//! PUBACK within `delivery.ack_timeout_s`, drops the connection; the next one (after
//! `delivery.mqtt.retry_s`) publishes the same entry again, with the same sequence number. While the
//! broker is away the backlog stays in the queue on disk; only the segment being sent is in memory.
//!
//! `hsiedge/<node>/status` is retained: `online` with the queue's state at each connection and
//! every [`STATUS_PERIOD`], `offline` as the last will (the broker publishes it when the node
//! vanishes) and on a clean stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rumqttc::{Client, Event, LastWill, MqttOptions, Outgoing, Packet, QoS, RecvTimeoutError};

use super::config::{DeliveryConfig, MqttConfig};
use super::{Queue, message};
use crate::daemon::log;
use crate::engine::error_chain;

/// This sink's name in the queue.
pub const SINK: &str = "mqtt";

/// How often the retained status is refreshed while connected.
pub const STATUS_PERIOD: Duration = Duration::from_secs(5);

/// How often a waiting thread looks at the stop flag (and lets the connection make progress).
const POLL: Duration = Duration::from_millis(100);

/// The largest packet accepted from the broker (the sink subscribes to nothing).
const MAX_INCOMING: usize = 64 << 10;

/// The largest packet sent: a segment's whole set.
const MAX_OUTGOING: usize = 256 << 20;

/// The topic segments of `scene` from `node` are published on.
pub fn segment_topic(node: &str, scene: &str) -> String {
    format!("hsiedge/{node}/{scene}/segment")
}

/// The node's retained status topic.
pub fn status_topic(node: &str) -> String {
    format!("hsiedge/{node}/status")
}

fn status(node: &str, state: &str, queue: &Queue) -> Vec<u8> {
    let q = queue.status();
    serde_json::json!({
        "node": node,
        "state": state,
        "queued": q.queued,
        "queue_max": q.max,
        "queue_full": q.full,
        "next_seq": q.next_seq,
        "pid": std::process::id(),
    })
    .to_string()
    .into_bytes()
}

/// A connection: the client and its event loop.
struct Session<'a> {
    client: Client,
    conn: rumqttc::Connection,
    stop: &'a AtomicBool,
}

impl Session<'_> {
    /// One event, or `None` when none came within [`POLL`].
    fn event(&mut self) -> Result<Option<Event>, String> {
        match self.conn.recv_timeout(POLL) {
            Ok(Ok(ev)) => Ok(Some(ev)),
            Ok(Err(e)) => Err(e.to_string()),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err("the MQTT event loop ended".into()),
        }
    }

    fn connected(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Err("stopping".into());
            }
            if let Some(Event::Incoming(Packet::ConnAck(_))) = self.event()? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!("no CONNACK within {:.0} s", timeout.as_secs_f64()));
            }
        }
    }

    /// Publishes at QoS 1 and waits for its PUBACK (the only publish in flight).
    fn publish(
        &mut self,
        topic: &str,
        payload: Vec<u8>,
        retain: bool,
        timeout: Duration,
        stoppable: bool,
    ) -> Result<(), String> {
        self.client
            .publish(topic, QoS::AtLeastOnce, retain, payload)
            .map_err(|e| format!("publishing on {topic}: {e}"))?;
        let deadline = Instant::now() + timeout;
        let mut pkid = None;
        loop {
            if stoppable && self.stop.load(Ordering::Acquire) {
                return Err("stopping".into());
            }
            match self.event()? {
                Some(Event::Outgoing(Outgoing::Publish(p))) if pkid.is_none() => pkid = Some(p),
                Some(Event::Incoming(Packet::PubAck(a))) if Some(a.pkid) == pkid => return Ok(()),
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(format!("no PUBACK on {topic} within {:.1} s", timeout.as_secs_f64()));
            }
        }
    }
}

/// The sink's loop, until `stop`: connect, publish the queue's entries in order, reconnect after
/// any failure.
pub fn run(m: &MqttConfig, queue: &Queue, config: &DeliveryConfig, stop: &AtomicBool) {
    let node = &config.node;
    let status_on = status_topic(node);
    let mut failures = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut opts = MqttOptions::new(&m.client_id, &m.host, m.port);
        opts.set_keep_alive(m.keep_alive);
        opts.set_clean_session(true);
        opts.set_max_packet_size(MAX_INCOMING, MAX_OUTGOING);
        opts.set_last_will(LastWill::new(
            &status_on,
            status(node, "offline", queue),
            QoS::AtLeastOnce,
            true,
        ));
        let (client, conn) = Client::new(opts, 4);
        let mut s = Session { client, conn, stop };
        match serve(&mut s, queue, config, &status_on) {
            Ok(()) => break,
            Err(_) if stop.load(Ordering::Acquire) => break,
            Err(why) => {
                failures += 1;
                // A broker that stays away is logged at the first failure and then every 60th.
                if failures == 1 || failures.is_multiple_of(60) {
                    log::event(
                        "mqtt_down",
                        &format!(
                            "MQTT broker {}:{}: {why}; {} segment(s) wait in the queue, retrying every {:.1} s",
                            m.host,
                            m.port,
                            queue.status().pending.get(SINK).copied().unwrap_or(0),
                            m.retry.as_secs_f64()
                        ),
                        serde_json::json!({"sink": SINK, "broker": format!("{}:{}", m.host, m.port), "failures": failures}),
                    );
                }
            }
        }
        drop(s);
        let until = Instant::now() + m.retry;
        while Instant::now() < until && !stop.load(Ordering::Acquire) {
            std::thread::sleep(POLL.min(m.retry));
        }
    }
}

/// One connection's life; `Ok` only when stopped.
fn serve(s: &mut Session, queue: &Queue, config: &DeliveryConfig, status_on: &str) -> Result<(), String> {
    let node = &config.node;
    s.connected(Duration::from_secs(10))?;
    s.publish(status_on, status(node, "online", queue), true, config.ack_timeout, true)?;
    log::event(
        "mqtt_connected",
        &format!("MQTT broker connected; publishing on hsiedge/{node}/..."),
        serde_json::json!({"sink": SINK, "node": node}),
    );
    let mut last_status = Instant::now();
    loop {
        if s.stop.load(Ordering::Acquire) {
            // A clean stop says so; the broker's copy of the will is then not sent.
            let _ = s.publish(
                status_on,
                status(node, "offline", queue),
                true,
                Duration::from_secs(1),
                false,
            );
            let _ = s.client.disconnect();
            return Ok(());
        }
        if last_status.elapsed() >= STATUS_PERIOD {
            s.publish(status_on, status(node, "online", queue), true, config.ack_timeout, true)?;
            last_status = Instant::now();
        }
        let Some(entry) = queue.next_for(SINK, Duration::ZERO) else {
            // Idle: the event loop still runs (keep-alive pings, a dropped connection seen).
            s.event()?;
            continue;
        };
        let msg = match message::build(&entry, node) {
            Ok(m) => message::encode(&m),
            Err(e) => {
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
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        let topic = segment_topic(node, &entry.scene_id);
        s.publish(&topic, msg, false, config.ack_timeout, true)?;
        if let Err(e) = queue.ack(entry.seq, SINK) {
            return Err(format!("recording the PUBACK of {}: {}", entry.seq, error_chain(&e)));
        }
    }
}
