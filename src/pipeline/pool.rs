//! The batch buffers of a run, bounded in number and reused from batch to batch.

use std::sync::{Condvar, Mutex, PoisonError};

/// The batch buffers of one run: at most `limit` exist at once, so a run's batch memory is
/// bounded by construction, not by how the producer and the engine happen to be timed.
///
/// Reusing the engine's spent buffers also keeps a steady run off the allocator: a fresh batch
/// buffer is a fresh mapping, faulted and zeroed by the kernel page by page and unmapped after its
/// run, which costs the engine's threads TLB shootdowns. A free buffer that does not fit the size
/// asked for (smaller, or more than a quarter larger) is dropped and replaced, so memory given back
/// when the governor shrinks the batch stays given.
///
/// A [`crate::job::Job`] keeps its pool from run to run, as the session keeps its arena: a run
/// then starts with its buffers resident instead of faulting megabytes in before the first batch.
#[derive(Debug)]
pub struct BufferPool {
    state: Mutex<PoolState>,
    returned: Condvar,
}

#[derive(Debug, Default)]
struct PoolState {
    free: Vec<Vec<f32>>,
    made: usize,
    limit: usize,
    closed: bool,
}

impl BufferPool {
    /// A pool that lets at most `limit` (at least 1) buffers exist.
    pub fn new(limit: usize) -> Self {
        Self {
            state: Mutex::new(PoolState {
                limit: limit.max(1),
                ..PoolState::default()
            }),
            returned: Condvar::new(),
        }
    }

    /// Opens the pool (again) for a run that may hold `limit` (at least 1) buffers: buffers kept
    /// from an earlier run are reused, and those beyond the new limit are freed now.
    pub fn reopen(&self, limit: usize) {
        let extra = {
            let mut s = self.lock();
            s.closed = false;
            s.limit = limit.max(1);
            let keep = s.free.len().saturating_sub(s.made.saturating_sub(s.limit));
            let extra = s.free.split_off(keep);
            s.made -= extra.len();
            extra
        };
        drop(extra);
    }

    /// The buffers a run over `units` units at `batch` per batch can have in flight: one running,
    /// `queue` queued and one being built, but no more than the scene has batches.
    pub fn run_limit(queue: usize, units: usize, batch: usize) -> usize {
        (queue + 2).min(units.div_ceil(batch.max(1))).max(1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A buffer with room for `need` values, holding whatever it held when given back (the caller
    /// clears or overwrites it): a free one that fits, else a new (empty) one while fewer than
    /// `limit` exist, else the next one given back. `None` once the pool is closed.
    pub fn take(&self, need: usize) -> Option<Vec<f32>> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return None;
            }
            if let Some(at) = s.free.iter().position(|v| fits(v, need)) {
                let v = s.free.swap_remove(at);
                drop(s);
                return Some(v);
            }
            let misfit = s.free.pop();
            if misfit.is_some() {
                s.made -= 1;
            }
            if s.made < s.limit {
                s.made += 1;
                drop(s);
                drop(misfit);
                return Some(Vec::with_capacity(need));
            }
            s = self.returned.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Gives a buffer back for reuse.
    pub fn give(&self, v: Vec<f32>) {
        self.lock().free.push(v);
        self.returned.notify_one();
    }

    /// Frees every buffer not in use now (the governor shrank the batch: give memory back at once).
    pub fn drop_spares(&self) {
        let spares = {
            let mut s = self.lock();
            s.made -= s.free.len();
            std::mem::take(&mut s.free)
        };
        drop(spares);
        self.returned.notify_all();
    }

    /// Makes buffers of `need` values, each page touched so it is resident, until `limit` exist.
    ///
    /// A run's memory then reaches its worst case at the start, as the memory plan counts it,
    /// instead of whenever the producer happens to get ahead: if it does not fit, that shows before
    /// the first batch, and calibration probes measure the same peak a long run reaches. Called on
    /// the engine's thread while the producer builds the first batch.
    pub fn fill(&self, need: usize) {
        let misfits = {
            let mut s = self.lock();
            let (fit, misfit): (Vec<_>, Vec<_>) = std::mem::take(&mut s.free).into_iter().partition(|v| fits(v, need));
            s.free = fit;
            s.made -= misfit.len();
            misfit
        };
        drop(misfits);
        loop {
            {
                let mut s = self.lock();
                if s.closed || s.made >= s.limit {
                    return;
                }
                s.made += 1;
            }
            let mut v: Vec<f32> = Vec::with_capacity(need);
            // One write per page makes it resident; the producer overwrites it all anyway.
            for slot in v
                .spare_capacity_mut()
                .iter_mut()
                .step_by(4096 / std::mem::size_of::<f32>())
            {
                slot.write(0.0);
            }
            self.give(v);
        }
    }

    /// Closes the pool: `take` returns `None` from now on, so a producer waiting for a buffer stops.
    pub fn close(&self) {
        self.lock().closed = true;
        self.returned.notify_all();
    }
}

/// Whether a free buffer serves a request for `need` values: large enough, and not more than a
/// quarter larger (memory given back when the batch shrinks stays given).
fn fits(v: &Vec<f32>, need: usize) -> bool {
    v.capacity() >= need && v.capacity() <= need + need / 4
}

/// Closes a pool when dropped, so the producer never waits on an engine thread that has left.
pub(super) struct CloseOnDrop<'a>(pub(super) &'a BufferPool);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_never_holds_more_than_its_limit_and_close_frees_a_waiter() {
        let pool = BufferPool::new(2);
        let a = pool.take(100).unwrap();
        pool.fill(100);
        let b = pool.take(100).unwrap();
        assert_eq!(pool.lock().made, 2);
        // A third take waits until one comes back.
        std::thread::scope(|s| {
            let waiter = s.spawn(|| pool.take(100).map(|v| v.capacity()));
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiter.is_finished());
            pool.give(a);
            assert!(waiter.join().unwrap().unwrap() >= 100);
        });
        // A free buffer of the wrong size is replaced, not added to.
        pool.give(b);
        let c = pool.take(1000).unwrap();
        assert!(c.capacity() >= 1000);
        assert_eq!(pool.lock().made, 2);
        pool.give(c);
        pool.drop_spares();
        assert_eq!(pool.lock().made, 1);
        std::thread::scope(|s| {
            let _one = pool.take(10).unwrap();
            let waiter = s.spawn(|| pool.take(10));
            std::thread::sleep(std::time::Duration::from_millis(50));
            pool.close();
            assert!(waiter.join().unwrap().is_none());
        });
        assert_eq!(BufferPool::run_limit(1, 100, 40), 3);
        assert_eq!(BufferPool::run_limit(1, 100, 60), 2);
        assert_eq!(BufferPool::run_limit(1, 0, 60), 1);
    }
}
