//! The sending end: scenes written as a sensor would, with faults injected on request.

use std::collections::BTreeSet;
use std::io::Write;

use super::scene::SceneHeader;
use super::wire;

/// Faults a [`SensorStream`] injects into every scene it sends, by line number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Lines never sent.
    pub drop: BTreeSet<u64>,
    /// Lines sent twice in a row.
    pub duplicate: BTreeSet<u64>,
    /// Lines sent after their successor instead of before it (line N+1, then N); a line whose
    /// successor is dropped or also listed goes out in order.
    pub swap: BTreeSet<u64>,
}

/// What a [`SensorStream`] sent so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SendStats {
    /// Scenes begun.
    pub scenes: u64,
    /// Line messages written (repeats included).
    pub line_messages: u64,
    /// Lines dropped by [`Faults::drop`].
    pub dropped: u64,
    /// Extra copies written by [`Faults::duplicate`].
    pub duplicated: u64,
    /// Lines sent after their successor by [`Faults::swap`].
    pub swapped: u64,
}

/// Writes scenes to `W` in the stream protocol: [`SensorStream::begin`], then
/// [`SensorStream::line`] for each line in order, then [`SensorStream::end`].
#[derive(Debug)]
pub struct SensorStream<W> {
    writer: W,
    faults: Faults,
    buf: Vec<u8>,
    /// A line held back by [`Faults::swap`] until its successor has gone.
    held: Option<(u64, Vec<u8>)>,
    stats: SendStats,
}

impl<W: Write> SensorStream<W> {
    /// A stream writing to `writer`, injecting `faults`.
    pub fn new(writer: W, faults: Faults) -> Self {
        Self {
            writer,
            faults,
            buf: Vec::new(),
            held: None,
            stats: SendStats::default(),
        }
    }

    /// Sends the scene message that begins a scene.
    pub fn begin(&mut self, header: &SceneHeader) -> std::io::Result<()> {
        self.held = None;
        wire::encode_scene(header, &mut self.buf);
        self.writer.write_all(&self.buf)?;
        self.stats.scenes += 1;
        Ok(())
    }

    /// Sends line `seq` (lines are passed in order; faults decide what goes on the wire).
    pub fn line(&mut self, seq: u64, data: &[u8]) -> std::io::Result<()> {
        if self.faults.drop.contains(&seq) {
            self.stats.dropped += 1;
            return self.release();
        }
        if self.faults.swap.contains(&seq) {
            // A held line whose successor is to be held too goes out in order: pairs do not chain.
            self.release()?;
            self.held = Some((seq, data.to_vec()));
            return Ok(());
        }
        self.send(seq, data)?;
        if self.held.is_some() {
            self.stats.swapped += 1;
        }
        self.release()
    }

    /// Sends the end message of a scene of `lines` lines (a held line first).
    pub fn end(&mut self, lines: u64) -> std::io::Result<()> {
        self.release()?;
        wire::encode_end(lines, &mut self.buf);
        self.writer.write_all(&self.buf)?;
        self.writer.flush()
    }

    /// What was sent so far.
    pub fn stats(&self) -> SendStats {
        self.stats
    }

    /// The writer back.
    pub fn into_inner(self) -> W {
        self.writer
    }

    /// Sends the line held back by a swap, if any.
    fn release(&mut self) -> std::io::Result<()> {
        match self.held.take() {
            Some((seq, data)) => self.send(seq, &data),
            None => Ok(()),
        }
    }

    fn send(&mut self, seq: u64, data: &[u8]) -> std::io::Result<()> {
        wire::encode_line(seq, data, &mut self.buf);
        self.writer.write_all(&self.buf)?;
        self.stats.line_messages += 1;
        if self.faults.duplicate.contains(&seq) {
            self.writer.write_all(&self.buf)?;
            self.stats.line_messages += 1;
            self.stats.duplicated += 1;
        }
        Ok(())
    }
}
