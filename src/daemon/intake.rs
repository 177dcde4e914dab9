//! The scene-intake seam: every intake (the socket listeners now; a spool folder of complete cubes
//! plugs in the same way) turns what arrives into an [`IntakeScene`] and hands it to
//! [`Routes::submit`], which picks the model, refuses a scene it cannot run before anything is
//! written, and queues it for that model's workers through a bounded channel: while the queue is
//! full, `submit` blocks, so the intake stops reading (a socket's sender is slowed by TCP
//! backpressure, a spool leaves its files where they are).
//!
//! A spool intake implements [`IntakeScene`] over a `FileSource` and its claim: `release(true)`
//! marks the claim done, `release(false)` failed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::conn::Conn;
use crate::model::Manifest;
use crate::pipeline::{self, PipelineError, RunOptions};
use crate::source::stream::{Limits, StreamSource};
use crate::source::{LineSource, SceneInfo, SourceError};

/// One scene handed over by an intake.
pub trait IntakeScene: Send {
    /// The scene's lines.
    fn source(&mut self) -> &mut dyn LineSource;

    /// After a run that used every line: takes in whatever the source still owes (a stream's
    /// `end` message), so the scene counts as delivered only when its source agrees.
    fn complete(&mut self) -> Result<(), SourceError> {
        Ok(())
    }

    /// A worker starts the scene's run (a spooled cube counts it against its attempts).
    fn started(&mut self) {}

    /// After [`Self::started`]: where the run says it waits for room downstream, when the scene
    /// keeps count of its attempts.
    fn attempt_mark(&self) -> Option<crate::source::spool::AttemptMark> {
        None
    }

    /// The scene is over, written (`ok`) or failed and moved aside; the intake releases what it
    /// holds for it.
    fn release(self: Box<Self>, ok: bool);

    /// Whether the scene's lines can be read again from where they are (a spooled cube, a
    /// recorded stream) without its sender; a stream's lines are recorded as they are read.
    fn durable_input(&self) -> bool {
        false
    }

    /// For a scene of durable input: starts its source again from its first line (a run paused
    /// for space goes on); false when it cannot.
    fn reopen(&mut self) -> bool {
        false
    }

    /// The scene was refused before its run for `reason`; nothing was written for it.
    fn refused(self: Box<Self>, reason: &str) {
        let _ = reason;
        self.release(false);
    }
}

/// A scene queued for a model's workers.
pub struct Job {
    /// The scene.
    pub scene: Box<dyn IntakeScene>,
    /// What its source said before the first line.
    pub info: SceneInfo,
    /// Lines per committed segment, as configured when the scene was accepted.
    pub segment_lines: usize,
    /// When it was queued.
    pub queued: Instant,
}

/// One model as intake sees it: what it accepts and where its scenes go.
#[derive(Debug, Clone)]
pub struct ModelRoute {
    /// The model's name in the configuration.
    pub name: String,
    /// Its manifest.
    pub manifest: Arc<Manifest>,
    /// The run settings its sessions use (mode, batch, tile).
    pub run: RunOptions,
    /// Why the batch is what it is.
    pub batch_reason: String,
    /// Worker threads (one session each).
    pub workers: usize,
    /// The model's queue.
    pub tx: Sender<Job>,
}

/// What intake needs of the configuration at one moment: a reload swaps in a new one, and a
/// scene keeps the routes it was accepted under.
#[derive(Debug, Clone)]
pub struct Routes {
    /// Models by name.
    pub models: BTreeMap<String, ModelRoute>,
    /// The model of scenes that name none.
    pub default_model: Option<String>,
    /// Lines per committed segment.
    pub segment_lines: usize,
    /// The stream's limits.
    pub limits: Limits,
    /// The longest raw line accepted.
    pub max_line_bytes: usize,
    /// How long a connection may wait between scenes.
    pub idle_timeout: Option<Duration>,
    /// How long a scene may wait for its next message.
    pub line_timeout: Option<Duration>,
}

/// Why a scene was not accepted; nothing was written for it.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The scene names no model and none is the default.
    #[error("{origin}: scene `{scene}` names no model and no default model is configured")]
    NoModel {
        /// Where it came from.
        origin: String,
        /// Its id.
        scene: String,
    },
    /// The scene names a model that is not configured.
    #[error("{origin}: scene `{scene}` asks for model `{model}`, which is not configured (configured: {known})")]
    UnknownModel {
        /// Where it came from.
        origin: String,
        /// Its id.
        scene: String,
        /// The model asked for.
        model: String,
        /// The models there are.
        known: String,
    },
    /// The scene does not fit its model (band count, layout).
    #[error("{origin}: scene `{scene}` cannot run on model `{model}`")]
    Model {
        /// Where it came from.
        origin: String,
        /// Its id.
        scene: String,
        /// The model.
        model: String,
        /// Why.
        source: PipelineError,
    },
    /// A line longer than the configuration allows.
    #[error("{origin}: scene `{scene}`: a line of {bytes} bytes is over intake.max_line_bytes ({max})")]
    LineTooLong {
        /// Where it came from.
        origin: String,
        /// Its id.
        scene: String,
        /// Bytes of one line.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The model's workers are gone (they stopped on an error the log names).
    #[error("scene `{scene}`: the workers of model `{model}` have stopped")]
    Stopped {
        /// Its id.
        scene: String,
        /// The model.
        model: String,
    },
}

impl Routes {
    /// The model that runs `info`, once the scene is known to fit it.
    pub fn route(&self, info: &SceneInfo) -> Result<&ModelRoute, Refusal> {
        let origin = info.origin.display().to_string();
        let name = match info.model.as_ref().or(self.default_model.as_ref()) {
            Some(n) => n,
            None => {
                return Err(Refusal::NoModel {
                    origin,
                    scene: info.id.clone(),
                });
            }
        };
        let route = self.models.get(name).ok_or_else(|| Refusal::UnknownModel {
            origin: origin.clone(),
            scene: info.id.clone(),
            model: name.clone(),
            known: self.models.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
        if info.line_bytes() > self.max_line_bytes {
            return Err(Refusal::LineTooLong {
                origin,
                scene: info.id.clone(),
                bytes: info.line_bytes(),
                max: self.max_line_bytes,
            });
        }
        pipeline::check_bands(info.bands, &info.origin, &route.manifest, &route.run).map_err(|source| {
            Refusal::Model {
                origin,
                scene: info.id.clone(),
                model: name.clone(),
                source,
            }
        })?;
        Ok(route)
    }

    /// Routes `scene` and queues it, waiting while its model's queue is full. A refused scene
    /// comes back with the reason, untouched.
    pub fn submit(&self, mut scene: Box<dyn IntakeScene>) -> Result<(), (Refusal, Box<dyn IntakeScene>)> {
        let info = scene.source().info().clone();
        let route = match self.route(&info) {
            Ok(r) => r,
            Err(e) => return Err((e, scene)),
        };
        let job = Job {
            scene,
            info,
            segment_lines: self.segment_lines,
            queued: Instant::now(),
        };
        route.tx.send(job).map_err(|e| {
            let job = e.into_inner();
            (
                Refusal::Stopped {
                    scene: job.info.id.clone(),
                    model: route.name.clone(),
                },
                job.scene,
            )
        })
    }
}

/// A scene arriving on a sensor connection; its connection goes back to the connection's thread
/// for the next scene once this one has ended cleanly.
pub struct StreamScene {
    source: StreamSource<Conn>,
    reply: Sender<Option<Conn>>,
}

impl StreamScene {
    /// The scene `source` has begun; the connection is sent on `reply` when it is over (`None`
    /// when the connection cannot carry another scene).
    pub fn new(source: StreamSource<Conn>, reply: Sender<Option<Conn>>) -> Self {
        Self { source, reply }
    }
}

impl IntakeScene for StreamScene {
    fn source(&mut self) -> &mut dyn LineSource {
        &mut self.source
    }

    fn complete(&mut self) -> Result<(), SourceError> {
        // A scene whose length was announced can be tiled to its end before its `end` message
        // has been read; the connection's next scene starts after it.
        if self.source.ended() {
            return Ok(());
        }
        let mut line = vec![0u8; self.source.info().line_bytes()];
        match self.source.next_line(&mut line)? {
            None => Ok(()),
            Some(_) => Err(SourceError::Protocol {
                what: self.source.info().origin.display().to_string(),
                message: format!("scene `{}`: a line after the scene's last", self.source.info().id),
            }),
        }
    }

    fn release(self: Box<Self>, ok: bool) {
        let Self { source, reply } = *self;
        let next = (ok && source.ended()).then(|| source.into_inner());
        // The connection's thread may be gone (a drain cut it off): nothing is left to hand back.
        let _ = reply.send(next);
    }
}
