//! Downstream delivery of committed segments, at least once, with sequence numbers consumers
//! de-duplicate on (docs/delivery.md).
//!
//! Every segment the daemon commits into the outbox (the outbox itself is the first sink: maps,
//! quick-look and summary through the set-atomic commit) enters the durable [`queue`] with a
//! sequence number, and leaves it once every configured sink has acknowledged it: the CBOR
//! [`socket`] sink (a subscriber's `ack`) and the [`mqtt`] sink (the broker's PUBACK at QoS 1).
//! Each sink is one thread sending the oldest entry it has not acknowledged, one at a time, so
//! segments arrive in queue order; a resend (timeout, reconnect, restart) carries the same
//! sequence number. The queue holds segment references, not maps: a sink reads one segment's
//! set from the outbox when it sends it, so memory stays bounded however long a sink is away.
//! While the queue holds `delivery.queue_max` entries the model workers take no new scene, so
//! the models' intake queues fill and sensors see backpressure.

pub mod config;
pub mod enqueue;
pub mod message;
pub mod mqtt;
pub mod queue;
pub mod socket;
pub mod subscribe;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

pub use config::{DeliveryConfig, RawDelivery};
pub use queue::{Entry, Queue, QueueStatus};

/// Why delivery failed, naming the file, socket or broker.
#[derive(Debug, thiserror::Error)]
pub enum DeliveryError {
    /// A file or folder of the queue or of a segment's set.
    #[error("{path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The queue's log holds a record that is not one (not at its end, where a crash may cut one).
    #[error("{path}: the delivery log is corrupt at offset {offset}: {message}")]
    Corrupt {
        /// The log.
        path: PathBuf,
        /// Where the bad record starts.
        offset: u64,
        /// What is wrong.
        message: String,
    },
    /// A socket could not be bound, connected, read or written.
    #[error("{what}")]
    Socket {
        /// The socket (`tcp ADDR`, `unix PATH`).
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A message broke the delivery protocol.
    #[error("{what}: {message}")]
    Protocol {
        /// The peer.
        what: String,
        /// What was wrong.
        message: String,
    },
    /// A thread could not be started.
    #[error("starting {what}")]
    Thread {
        /// Which thread.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The queue and its sink threads.
#[derive(Debug)]
pub struct Delivery {
    /// The queue.
    pub queue: Arc<Queue>,
    /// `delivery.node`.
    pub node: String,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Delivery {
    /// Opens the queue in `state/delivery` and starts a thread per configured sink; `None` when
    /// no sink is configured (the outbox alone).
    pub fn start(config: &DeliveryConfig, state: &std::path::Path) -> Result<Option<Self>, DeliveryError> {
        let mut sinks = Vec::new();
        if config.subscriber.is_some() {
            sinks.push(socket::SINK.to_string());
        }
        if config.mqtt.is_some() {
            sinks.push(mqtt::SINK.to_string());
        }
        if sinks.is_empty() {
            return Ok(None);
        }
        let queue = Arc::new(Queue::open(&state.join("delivery"), sinks, config.queue_max)?);
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        if let Some(addr) = &config.subscriber {
            let listener = socket::bind(addr)?;
            let (q, s, c) = (queue.clone(), stop.clone(), config.clone());
            threads.push(spawn("hsiedge-deliver-socket", move || {
                socket::run(listener, &q, &c, &s)
            })?);
        }
        if let Some(m) = &config.mqtt {
            let (q, s, c, m) = (queue.clone(), stop.clone(), config.clone(), m.clone());
            threads.push(spawn("hsiedge-deliver-mqtt", move || mqtt::run(&m, &q, &c, &s))?);
        }
        Ok(Some(Self {
            queue,
            node: config.node.clone(),
            stop,
            threads,
        }))
    }

    /// Stops the sink threads (what they have not delivered stays queued for the next start).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, DeliveryError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|source| DeliveryError::Thread {
            what: name.into(),
            source,
        })
}
