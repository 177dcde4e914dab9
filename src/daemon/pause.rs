//! When a model's workers take no new scene: the delivery queue at its bound, or the outbox's
//! file system short of `delivery.outbox_min_free_mib`; intake waits (backpressure) meanwhile.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::log;
use super::worker::WorkerContext;

/// Why this worker must not take a scene now: the delivery queue at its bound, or the outbox's
/// file system short of `delivery.outbox_min_free_mib`.
fn pause_reason(ctx: &WorkerContext) -> Option<(&'static str, String)> {
    if ctx.draining.load(Ordering::Acquire) {
        return None;
    }
    if let Some(q) = &ctx.delivery
        && q.full()
    {
        let s = q.status();
        return Some((
            "delivery_full",
            format!(
                "delivery queue full ({} of {} segments not yet acknowledged by every sink)",
                s.queued, s.max
            ),
        ));
    }
    if ctx.outbox_min_free > 0 {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        match crate::ffi::available_bytes(&ctx.outbox) {
            Ok(free) if free < ctx.outbox_min_free => {
                return Some((
                    "outbox_full",
                    format!(
                        "the outbox {} has {:.1} MiB free, under delivery.outbox_min_free_mib ({:.0} MiB)",
                        ctx.outbox.display(),
                        mib(free),
                        mib(ctx.outbox_min_free)
                    ),
                ));
            }
            Ok(_) => {}
            Err(e) => {
                return Some((
                    "outbox_full",
                    format!(
                        "the outbox {}: its free space cannot be read: {e}",
                        ctx.outbox.display()
                    ),
                ));
            }
        }
    }
    None
}

/// Waits while [`pause_reason`] gives a reason: this worker takes no scene, so its model's
/// intake queue fills and the sensors see backpressure (a spool's cubes stay in its inbox).
/// The pause is logged when it begins and ends, and `status` shows it meanwhile.
pub fn wait_for_intake(ctx: &WorkerContext, model: &str) {
    let Some((event, why)) = pause_reason(ctx) else {
        return;
    };
    log::event(
        event,
        &format!("{why}: model `{model}` takes no new scene until it clears"),
        serde_json::json!({"model": model, "delivery": ctx.delivery.as_ref().map(|q| q.status())}),
    );
    ctx.status.set_paused(model, Some(why));
    let t0 = Instant::now();
    loop {
        let tick = std::time::Duration::from_millis(250);
        match &ctx.delivery {
            // Woken as soon as a sink acknowledges.
            Some(q) if q.full() => {
                q.wait_for_room(tick);
            }
            _ => std::thread::sleep(tick),
        }
        match pause_reason(ctx) {
            None => break,
            Some((_, why)) => ctx.status.set_paused(model, Some(why)),
        }
    }
    ctx.status.set_paused(model, None);
    let paused_s = t0.elapsed().as_secs_f64();
    log::event(
        "intake_resumed",
        &format!("model `{model}` takes scenes again after a pause of {paused_s:.1} s"),
        serde_json::json!({"model": model, "paused_s": paused_s}),
    );
}
