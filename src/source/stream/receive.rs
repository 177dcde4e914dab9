//! The receiving end: one scene of a stream as a [`LineSource`], with the gap and duplicate policy.

use std::io::Read;

use super::wire::{self, Frame, FrameError, Limits, Message};
use crate::source::{LineSource, LineStatus, SceneInfo, SourceError, SourceStats};

/// One scene read from a line stream (see the module documentation for the protocol and policy).
///
/// [`StreamSource::open`] reads the scene message; [`LineSource::next_line`] then hands out the
/// scene's lines in order, a skipped line as [`LineStatus::Missing`], until the `end` message.
/// [`StreamSource::into_inner`] then gives the reader back for the connection's next scene.
#[derive(Debug)]
pub struct StreamSource<R> {
    reader: R,
    info: SceneInfo,
    limits: Limits,
    /// The next line number to hand out.
    next: u64,
    /// A received line ahead of `next`, waiting while the lines before it are reported missing.
    pending: Option<u64>,
    /// The last message's bytes.
    frame: Vec<u8>,
    /// The pending line's bytes.
    held: Vec<u8>,
    /// The line count the `end` message gave, once it came.
    end: Option<u64>,
    /// The highest line number received.
    last_received: Option<u64>,
    stats: SourceStats,
}

impl<R: Read + Send> StreamSource<R> {
    /// Reads the next scene message from `reader`, which `peer` names in errors (e.g. `tcp
    /// 127.0.0.1:5555` or a socket path). `Ok(None)` when the peer closed the connection cleanly
    /// before a new scene, as it does after its last one.
    ///
    /// Refused: a message longer than [`Limits::max_header_bytes`], a message that is not a
    /// scene, and a scene [`SceneInfo::validate`] refuses (its bands are reported as sent: a
    /// model's band count is checked by whoever picks the model).
    pub fn open(mut reader: R, peer: &str, limits: Limits) -> Result<Option<Self>, SourceError> {
        let mut frame = Vec::new();
        let protocol = |message: String| SourceError::Protocol {
            what: peer.to_string(),
            message,
        };
        match wire::read_frame(&mut reader, limits.max_header_bytes, &mut frame) {
            Ok(Frame::Eof) => return Ok(None),
            Ok(Frame::Message) => {}
            Err(FrameError::Io(source)) => {
                return Err(SourceError::Io {
                    what: format!("{peer}: reading a scene message"),
                    source,
                });
            }
            Err(e) => return Err(protocol(format!("waiting for a scene message: {e}"))),
        }
        let header = match wire::decode(&frame) {
            Ok(Message::Scene(h)) => h,
            Ok(other) => {
                return Err(protocol(format!(
                    "a message of type `{}` where a scene message must come first",
                    other.kind()
                )));
            }
            Err(e) => return Err(protocol(format!("waiting for a scene message: {e}"))),
        };
        let info = header.into_info(peer)?;
        Ok(Some(Self {
            reader,
            info,
            limits,
            next: 0,
            pending: None,
            frame,
            held: Vec::new(),
            end: None,
            last_received: None,
            stats: SourceStats::default(),
        }))
    }

    /// Whether the scene's `end` message has come (its trailing missing lines may still be due).
    pub fn ended(&self) -> bool {
        self.end.is_some()
    }

    /// The reader, positioned after this scene's `end` message once [`StreamSource::ended`]
    /// (else somewhere inside the scene).
    pub fn into_inner(self) -> R {
        self.reader
    }

    fn protocol(&self, message: String) -> SourceError {
        SourceError::Protocol {
            what: self.info.origin.display().to_string(),
            message: format!("scene `{}`: {message}", self.info.id),
        }
    }

    /// Where the scene stands, for errors: the last line received.
    fn progress(&self) -> String {
        match self.last_received {
            Some(l) => format!("last line received: {l}"),
            None => "no line received".into(),
        }
    }

    /// Reads messages until one changes what the next line is: a line at or after `next` (kept
    /// pending) or the end. Duplicates and late lines are dropped and counted on the way.
    fn receive(&mut self) -> Result<(), SourceError> {
        let line_bytes = self.info.line_bytes();
        let max = self.limits.max_scene_frame(line_bytes);
        loop {
            match wire::read_frame(&mut self.reader, max, &mut self.frame) {
                Ok(Frame::Message) => {}
                Ok(Frame::Eof) => {
                    return Err(self.protocol(format!(
                        "connection closed before the end message ({})",
                        self.progress()
                    )));
                }
                Err(FrameError::Io(source)) => {
                    return Err(SourceError::Io {
                        what: format!(
                            "{}: scene `{}` ({})",
                            self.info.origin.display(),
                            self.info.id,
                            self.progress()
                        ),
                        source,
                    });
                }
                Err(e) => return Err(self.protocol(format!("{e} ({})", self.progress()))),
            }
            let msg = wire::decode(&self.frame).map_err(|e| self.protocol(format!("{e} ({})", self.progress())))?;
            match msg {
                Message::Line { seq, data } => {
                    if data.len() != line_bytes {
                        return Err(self.protocol(format!(
                            "line {seq} has {} bytes, not the {line_bytes} of {} samples x {} bands of {:?}",
                            data.len(),
                            self.info.samples,
                            self.info.bands,
                            self.info.data_type
                        )));
                    }
                    if let Some(total) = self.info.lines
                        && seq >= total as u64
                    {
                        return Err(self.protocol(format!("line {seq} of a scene announced with {total} lines")));
                    }
                    if seq < self.next {
                        self.stats.duplicates += 1;
                        continue;
                    }
                    self.check_gap(seq, &format!("line {seq}"))?;
                    self.last_received = Some(seq);
                    self.held = data;
                    self.pending = Some(seq);
                    return Ok(());
                }
                Message::End { lines } => {
                    if lines < self.next {
                        return Err(self.protocol(format!(
                            "the end message says {lines} lines after {} were received or reported missing",
                            self.next
                        )));
                    }
                    if let Some(total) = self.info.lines
                        && lines != total as u64
                    {
                        return Err(self.protocol(format!(
                            "the end message says {lines} lines; the scene message said {total}"
                        )));
                    }
                    self.check_gap(lines, &format!("an end message of {lines} lines"))?;
                    self.end = Some(lines);
                    return Ok(());
                }
                Message::Scene(h) => {
                    return Err(self.protocol(format!(
                        "a scene message (`{}`) before this scene's end message ({})",
                        h.scene_id.escape_debug(),
                        self.progress()
                    )));
                }
            }
        }
    }

    /// Refuses a message that would report more than [`Limits::max_gap`] lines missing at once.
    fn check_gap(&self, upto: u64, what: &str) -> Result<(), SourceError> {
        let gap = upto - self.next;
        if gap > self.limits.max_gap {
            return Err(self.protocol(format!(
                "{what} would leave lines {} to {} missing, more than the {} allowed",
                self.next,
                upto - 1,
                self.limits.max_gap
            )));
        }
        Ok(())
    }
}

impl<R: Read + Send> LineSource for StreamSource<R> {
    fn info(&self) -> &SceneInfo {
        &self.info
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
        if line.len() != self.info.line_bytes() {
            return Err(self.protocol(format!(
                "a line buffer of {} bytes, not {}",
                line.len(),
                self.info.line_bytes()
            )));
        }
        if self.pending.is_none() && self.end.is_none() {
            self.receive()?;
        }
        // After receive(), a line is pending or the end has come.
        let upto = self.pending.or(self.end).unwrap_or(self.next);
        if self.next < upto {
            self.stats.add_missing(self.next);
            self.next += 1;
            self.stats.lines += 1;
            return Ok(Some(LineStatus::Missing));
        }
        if self.pending.take().is_some() {
            line.copy_from_slice(&self.held);
            self.next += 1;
            self.stats.lines += 1;
            return Ok(Some(LineStatus::Received));
        }
        Ok(None)
    }

    fn stats(&self) -> SourceStats {
        self.stats.clone()
    }
}
