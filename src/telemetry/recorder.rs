//! The hot path: the engine thread's per-batch record, pushed without allocation, lock or system
//! call into a fixed single-producer single-consumer ring that the aggregator thread drains.
//!
//! Why an SPSC ring (`heapless::spsc`) and not a bounded channel or a mutex: there is exactly one
//! producer (the engine thread, through `progress`) and one consumer (the aggregator), so a
//! wait-free enqueue of a `Copy` record into a ring allocated once is all the hot path needs. A
//! channel would add a receiver wake-up (a futex call) per message or a blocking send when full;
//! a mutex would let the aggregator's drain delay a batch. When the ring is full (the aggregator
//! fell more than [`RING_SLOTS`] batches behind) the record is counted as dropped, never waited
//! for; the running totals (pixels, batches, queue depth, batch) are kept beside the ring in
//! atomics, so a dropped record loses only its latency sample.

use std::sync::atomic::{AtomicU64, Ordering};

use heapless::spsc::{Consumer, Producer, Queue};

use crate::pipeline::BatchDone;

/// Slots of the ring (it holds one fewer): at the aggregator's 4 drains a second, up to about
/// 8000 batches a second pass without a drop.
pub const RING_SLOTS: usize = 2048;

/// The latest totals, written by the engine thread, read by the aggregator.
#[derive(Debug, Default)]
pub struct Totals {
    pixels_done: AtomicU64,
    batches: AtomicU64,
    queued: AtomicU64,
    batch: AtomicU64,
    dropped: AtomicU64,
}

/// A copy of [`Totals`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TotalsNow {
    /// Pixels stitched so far.
    pub pixels_done: u64,
    /// Batches run so far.
    pub batches: u64,
    /// Batches queued at the last batch.
    pub queued: u64,
    /// The batch in force.
    pub batch: u64,
    /// Records dropped on a full ring.
    pub dropped: u64,
}

impl Totals {
    /// Reads the totals (each one atomically; together they may straddle a batch).
    pub fn now(&self) -> TotalsNow {
        TotalsNow {
            pixels_done: self.pixels_done.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            queued: self.queued.load(Ordering::Relaxed),
            batch: self.batch.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

/// The ring and the totals, allocated once; [`Ring::split`] hands out the two ends.
pub struct Ring {
    queue: Box<Queue<BatchDone, RING_SLOTS>>,
    totals: Totals,
}

impl Default for Ring {
    fn default() -> Self {
        Self::new()
    }
}

impl Ring {
    /// Allocates the ring (its only allocation).
    pub fn new() -> Self {
        Self {
            queue: Box::new(Queue::new()),
            totals: Totals::default(),
        }
    }

    /// Records the batch in force before the first batch reports (so a snapshot taken before
    /// it shows the batch chosen).
    pub fn set_batch(&mut self, batch: u64) {
        self.totals.batch.store(batch, Ordering::Relaxed);
    }

    /// The producer end for the engine thread and the consumer end for the aggregator.
    pub fn split(&mut self) -> (Recorder<'_>, Drain<'_>) {
        let (producer, consumer) = self.queue.split();
        let totals = &self.totals;
        (
            Recorder {
                producer,
                totals,
                stop: None,
            },
            Drain { consumer, totals },
        )
    }
}

/// The engine thread's end: [`Recorder::record`] is what the `progress` callback calls.
pub struct Recorder<'r> {
    producer: Producer<'r, BatchDone>,
    totals: &'r Totals,
    stop: Option<std::sync::mpsc::Sender<()>>,
}

impl Recorder<'_> {
    /// Records one batch: four relaxed stores and a wait-free enqueue; never allocates, locks or
    /// blocks. On a full ring the record is counted as dropped.
    #[inline]
    pub fn record(&mut self, done: &BatchDone) {
        let t = self.totals;
        t.pixels_done.store(done.pixels_done as u64, Ordering::Relaxed);
        t.batches.store(done.batches as u64, Ordering::Relaxed);
        t.queued.store(done.queued as u64, Ordering::Relaxed);
        t.batch.store(done.batch as u64, Ordering::Relaxed);
        if self.producer.enqueue(*done).is_err() {
            t.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Says the run is over: the aggregator takes the final snapshot now, while the caller goes
    /// on (writing its maps), instead of when the caller's body returns. Batches recorded after
    /// this are not in the final snapshot. Does nothing outside [`super::run`] or when called
    /// twice.
    pub fn end(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The aggregator has already ended when the send fails; nothing is lost.
            let _ = stop.send(());
        }
    }

    /// Connects [`Recorder::end`] to an aggregator.
    pub(super) fn set_stop(&mut self, stop: std::sync::mpsc::Sender<()>) {
        self.stop = Some(stop);
    }
}

/// The aggregator's end.
pub struct Drain<'r> {
    consumer: Consumer<'r, BatchDone>,
    totals: &'r Totals,
}

impl Drain<'_> {
    /// Takes every queued record, oldest first.
    pub fn drain(&mut self, mut each: impl FnMut(&BatchDone)) -> usize {
        let mut n = 0;
        while let Some(d) = self.consumer.dequeue() {
            each(&d);
            n += 1;
        }
        n
    }

    /// The totals now.
    pub fn totals(&self) -> TotalsNow {
        self.totals.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(i: usize) -> BatchDone {
        BatchDone {
            batches: i + 1,
            pixels_done: (i + 1) * 64,
            units: 64,
            pixels: 64,
            infer_s: i as f64 * 1e-3,
            wait_s: 0.0,
            queued: i % 3,
            batch: 64,
        }
    }

    #[test]
    fn records_never_allocate_and_a_full_ring_counts_drops() {
        let mut ring = Ring::new();
        let (mut rec, mut drain) = ring.split();
        let n = 3 * RING_SLOTS;
        let info = allocation_counter::measure(|| {
            for i in 0..n {
                rec.record(&done(i));
            }
        });
        assert_eq!(info.count_total, 0, "the hot path allocated");
        let totals = drain.totals();
        // The totals follow every batch, dropped or not.
        assert_eq!(totals.batches, n as u64);
        assert_eq!(totals.pixels_done, n as u64 * 64);
        assert_eq!(totals.dropped, (n - (RING_SLOTS - 1)) as u64);
        let mut seen = Vec::new();
        assert_eq!(drain.drain(|d| seen.push(d.batches)), RING_SLOTS - 1);
        // The ring kept the first records it could hold, in order.
        assert_eq!(seen.first(), Some(&1));
        assert_eq!(seen.last(), Some(&(RING_SLOTS - 1)));
        // Drained, it takes records again without allocating.
        let info = allocation_counter::measure(|| rec.record(&done(n)));
        assert_eq!(info.count_total, 0);
        assert_eq!(drain.drain(|_| {}), 1);
    }

    #[test]
    fn records_cross_threads_in_order() {
        let mut ring = Ring::new();
        let (mut rec, mut drain) = ring.split();
        let total = 20_000;
        let got = std::thread::scope(|s| {
            let consumer = s.spawn(move || {
                let mut got = Vec::new();
                while got.len() + (drain.totals().dropped as usize) < total {
                    drain.drain(|d| got.push(d.batches));
                    std::thread::yield_now();
                }
                got
            });
            for i in 0..total {
                rec.record(&done(i));
            }
            consumer.join().unwrap_or_default()
        });
        assert!(!got.is_empty());
        assert!(got.windows(2).all(|w| w[0] < w[1]), "records out of order");
    }
}
