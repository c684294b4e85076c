//! Kubernetes Events, sent off the reconcile path. An Event is best effort and tells a human
//! what happened; a reconcile that awaited each one would hold a worker for a round trip per
//! phase change. Reconciles queue them instead, and one task per term of leadership sends them
//! in the order they were queued (so one object's Events stay in order).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::metrics::Metrics;

/// Events queued and not yet sent. Beyond this (the API server is down or far behind) new
/// Events are dropped and counted rather than held without bound.
const QUEUE: usize = 4096;
/// How long a stopping term waits for queued Events to go out.
const DRAIN: Duration = Duration::from_secs(5);

/// The events API caps notes at 1 kB.
const NOTE_MAX_CHARS: usize = 1024;

/// Queues Events for the sender task.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<(ObjectReference, Event)>,
    metrics: Arc<Metrics>,
}

/// The sender task; `drain` ends it once every `Events` handle is gone.
pub struct Sender {
    task: JoinHandle<()>,
}

/// Start a sender reporting as `reporter`.
pub fn start(client: Client, reporter: Reporter, metrics: Arc<Metrics>) -> (Events, Sender) {
    let (queue, mut queued) = mpsc::channel::<(ObjectReference, Event)>(QUEUE);
    let recorder = Recorder::new(client, reporter);
    let counted = metrics.clone();
    let task = tokio::spawn(async move {
        while let Some((object, event)) = queued.recv().await {
            counted.wrote("events", "create");
            if let Err(err) = recorder.publish(&event, &object).await {
                warn!(error = %err, reason = %event.reason, object = ?object.name, "could not record event");
            }
        }
    });
    (Events { queue, metrics }, Sender { task })
}

impl Events {
    /// Queue an Event about `object`; never waits.
    pub fn send(&self, object: ObjectReference, type_: EventType, reason: &str, note: &str) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(NOTE_MAX_CHARS).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = self.queue.try_send((object, event)) {
            self.metrics.event_dropped();
            let (object, event) = match &err {
                mpsc::error::TrySendError::Full(e) | mpsc::error::TrySendError::Closed(e) => e,
            };
            warn!(reason = %event.reason, object = ?object.name, "event queue full; event dropped");
        }
    }
}

impl Sender {
    /// Wait (bounded) for the queued Events to be sent. Every `Events` handle must be dropped
    /// first, or this waits the whole bound.
    pub async fn drain(self) {
        let mut task = self.task;
        if tokio::time::timeout(DRAIN, &mut task).await.is_err() {
            warn!("queued events not sent within {DRAIN:?}; dropping them");
            task.abort();
        }
    }
}
