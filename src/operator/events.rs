//! Kubernetes Events, sent off the reconcile path. An Event is best effort and tells a human
//! what happened; a reconcile that awaited each one would hold a worker for a round trip per
//! phase change. Reconciles queue them instead, and one task per term of leadership sends them
//! in the order they were queued (so one object's Events stay in order).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// The events API refuses a note longer than 1 kB (bytes, not characters).
const NOTE_MAX_BYTES: usize = 1024;

/// Queues Events for the sender task.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<(ObjectReference, Event)>,
    metrics: Arc<Metrics>,
    /// Queued or being sent.
    pending: Arc<AtomicUsize>,
}

/// The sender task; `drain` ends it once every `Events` handle is gone. Dropped without
/// draining (a term that lost its leadership), it stops the task at once: an Event is a write
/// too, and a replica that no longer leads sends none.
pub struct Sender {
    task: JoinHandle<()>,
    metrics: Arc<Metrics>,
    pending: Arc<AtomicUsize>,
}

/// Start a sender reporting as `reporter`.
pub fn start(client: Client, reporter: Reporter, metrics: Arc<Metrics>) -> (Events, Sender) {
    let (queue, mut queued) = mpsc::channel::<(ObjectReference, Event)>(QUEUE);
    let recorder = Recorder::new(client, reporter);
    let counted = metrics.clone();
    let pending = Arc::new(AtomicUsize::new(0));
    let taken = pending.clone();
    let task = tokio::spawn(async move {
        while let Some((object, event)) = queued.recv().await {
            counted.wrote("events", "create");
            if let Err(err) = recorder.publish(&event, &object).await {
                warn!(error = %err, reason = %event.reason, object = ?object.name, "could not record event");
            }
            taken.fetch_sub(1, Ordering::Relaxed);
        }
    });
    (Events { queue, metrics: metrics.clone(), pending: pending.clone() }, Sender { task, metrics, pending })
}

impl Events {
    /// Queue an Event about `object`; never waits.
    pub fn send(&self, object: ObjectReference, type_: EventType, reason: &str, note: &str) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(within_bytes(note, NOTE_MAX_BYTES).to_string()),
            action: "Reconcile".into(),
            secondary: None,
        };
        self.pending.fetch_add(1, Ordering::Relaxed);
        if let Err(err) = self.queue.try_send((object, event)) {
            self.pending.fetch_sub(1, Ordering::Relaxed);
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
        self.drain_within(DRAIN).await
    }

    async fn drain_within(mut self, limit: Duration) {
        if tokio::time::timeout(limit, &mut self.task).await.is_err() {
            warn!("queued events not sent within {limit:?}");
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.task.abort();
        // Those queued, and the one being sent (which the API server may yet have taken).
        let lost = self.pending.swap(0, Ordering::Relaxed);
        if lost > 0 {
            self.metrics.events_dropped(lost as u64);
            warn!(lost, "the term ended with events unsent; dropping them");
        }
    }
}

/// The longest start of `text` that fits in `max` bytes without cutting a character.
fn within_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let end = (0..=max).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_left_when_a_term_ends_are_counted_as_dropped() {
        // An API server that accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                open.push(socket);
            }
        });
        let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let metrics = Arc::new(Metrics::default());
        let reporter = Reporter { controller: "test".into(), instance: None };
        let (events, sender) = start(client.clone(), reporter, metrics.clone());
        for i in 0..3 {
            let object =
                ObjectReference { name: Some(format!("w{i}")), namespace: Some("a".into()), ..Default::default() };
            events.send(object, EventType::Normal, "Running", "Running");
        }
        drop(events);
        sender.drain_within(Duration::from_millis(300)).await;
        assert_eq!(metrics.dropped_events(), 3, "one in flight, two queued");

        // A term that lost its leadership is dropped, Events handles and all, without a
        // drain: its queued Events are dropped at once and the task is gone.
        let (events, sender) = start(client, Reporter { controller: "test".into(), instance: None }, metrics.clone());
        for i in 0..2 {
            let object =
                ObjectReference { name: Some(format!("v{i}")), namespace: Some("a".into()), ..Default::default() };
            events.send(object, EventType::Normal, "Running", "Running");
        }
        let task = sender.task.abort_handle();
        drop(sender);
        let ended = tokio::time::timeout(Duration::from_secs(5), async {
            while !task.is_finished() {
                tokio::task::yield_now().await;
            }
        });
        assert!(ended.await.is_ok(), "the sender task ends with its term");
        assert_eq!(metrics.dropped_events(), 5);
        held.abort();
    }

    #[test]
    fn notes_are_cut_at_a_character_within_the_byte_limit() {
        assert_eq!(within_bytes("short", NOTE_MAX_BYTES), "short");
        // 'é' is two bytes, '€' three: 600 characters are 1200 bytes.
        let accented = "é".repeat(600);
        let cut = within_bytes(&accented, NOTE_MAX_BYTES);
        assert_eq!(cut.len(), 1024, "512 whole characters");
        let euros = "€".repeat(400);
        let cut = within_bytes(&euros, NOTE_MAX_BYTES);
        assert_eq!((cut.len(), cut.chars().count()), (1023, 341), "never half a character");
        assert!(within_bytes(&"x".repeat(2000), NOTE_MAX_BYTES).len() == NOTE_MAX_BYTES);
    }
}
