//! Kubernetes Events, sent off the reconcile path: an Event is best effort, and awaiting each
//! would hold a worker for a round trip. Reconciles queue them; one task per term of
//! leadership sends them in order.
//!
//! Not kube-runtime's `Recorder`, which keeps every Event it sent for six minutes to count
//! repeats, so a burst of thousands of new workloads held thousands of Events in memory. Here
//! a repeat is recognised by a fingerprint, and only name and count are kept, for at most
//! `SERIES_MAX` Events.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::metrics::Metrics;

/// Events queued and not yet sent. Beyond this (API server down or far behind) new Events
/// are dropped and counted.
const QUEUE: usize = 4096;
/// How long a stopping term waits for queued Events to go out.
const DRAIN: Duration = Duration::from_secs(5);

/// The events API refuses a note longer than 1 kB (bytes, not characters).
const NOTE_MAX_BYTES: usize = 1024;

/// A repeat within this long is counted on the first Event's series instead of stored again,
/// as kube-runtime's and client-go's recorders do.
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);
/// At most this many Events are remembered for their series, oldest dropped first. The
/// repeats a series is for (a `Forbidden` per retry, repeated drift) are few and recent.
pub const SERIES_MAX: usize = 512;
/// Queues Events for the sender task.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<(ObjectReference, Event)>,
    metrics: Arc<Metrics>,
    /// Queued or being sent.
    pending: Arc<AtomicUsize>,
}

/// The sender task; `drain` ends it once every `Events` handle is gone. Dropped without
/// draining (leadership lost), it stops at once: an Event is a write too.
pub struct Sender {
    task: JoinHandle<()>,
    metrics: Arc<Metrics>,
    pending: Arc<AtomicUsize>,
}

pub fn start(client: Client, reporter: Reporter, metrics: Arc<Metrics>) -> (Events, Sender) {
    let (queue, mut queued) = mpsc::channel::<(ObjectReference, Event)>(QUEUE);
    let mut publisher = Publisher { client, reporter, series: Series::default() };
    let counted = metrics.clone();
    let pending = Arc::new(AtomicUsize::new(0));
    let taken = pending.clone();
    let task = tokio::spawn(async move {
        while let Some((object, event)) = queued.recv().await {
            let answer = publisher.publish(&event, &object).await;
            counted.sent("events", "create", &answer);
            if let Err(err) = answer {
                warn!(error = %err, reason = %event.reason, object = ?object.name, "could not record event");
            }
            taken.fetch_sub(1, Ordering::Relaxed);
        }
    });
    (Events { queue, metrics: metrics.clone(), pending: pending.clone() }, Sender { task, metrics, pending })
}

/// Sends Events to the events API (`events.k8s.io/v1`), a repeat as a count on its series.
struct Publisher {
    client: Client,
    reporter: Reporter,
    series: Series,
}

impl Publisher {
    async fn publish(&mut self, ev: &Event, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = fingerprint(ev, regarding);
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        if let Some((name, count)) = self.series.repeat(key, now) {
            let series = EventSeries { count, last_observed_time: MicroTime(now) };
            let patch = serde_json::json!({ "series": series });
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
            self.series.counted(key, count, now);
        } else {
            let event = new_event(&self.reporter, ev, regarding, now);
            let name = event.metadata.name.clone().unwrap_or_default();
            api.create(&PostParams::default(), &event).await?;
            self.series.first(key, name, now);
        }
        Ok(())
    }
}

/// What a repeat shares with the Event it repeats: type, reason, action and object (as
/// kube-runtime's `Recorder` keys series; the note is the first one's).
fn fingerprint(ev: &Event, regarding: &ObjectReference) -> u64 {
    // SipHash with fixed keys: the same in every process.
    let mut h = std::hash::DefaultHasher::new();
    (matches!(ev.type_, EventType::Warning), &ev.reason, &ev.action).hash(&mut h);
    let r = regarding;
    (&r.api_version, &r.kind, &r.namespace, &r.name, &r.uid).hash(&mut h);
    h.finish()
}

/// A new Event, as kube-runtime's `Recorder` makes one.
fn new_event(reporter: &Reporter, ev: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
    let name = regarding.name.as_deref().unwrap_or(&reporter.controller);
    K8sEvent {
        action: Some(ev.action.clone()),
        reason: Some(ev.reason.clone()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        note: ev.note.clone(),
        metadata: ObjectMeta {
            namespace: regarding.namespace.clone(),
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            ..Default::default()
        },
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(reporter.instance.clone().unwrap_or_else(|| reporter.controller.clone())),
        type_: Some(match ev.type_ {
            EventType::Normal => "Normal".into(),
            EventType::Warning => "Warning".into(),
        }),
        related: ev.secondary.clone(),
        ..Default::default()
    }
}

/// The Events sent in the last `SERIES_TTL`, by fingerprint, at most `SERIES_MAX`. Pure; the
/// clock is passed in.
#[derive(Default)]
struct Series {
    sent: HashMap<u64, Sent>,
}

struct Sent {
    name: String,
    count: i32,
    last: Timestamp,
}

impl Series {
    /// The Event this one repeats, and the repeat's count, if one was sent within `SERIES_TTL`.
    fn repeat(&mut self, key: u64, now: Timestamp) -> Option<(String, i32)> {
        self.sent.retain(|_, s| s.last + SERIES_TTL > now);
        self.sent.get(&key).map(|s| (s.name.clone(), s.count.saturating_add(1)))
    }

    fn counted(&mut self, key: u64, count: i32, now: Timestamp) {
        if let Some(s) = self.sent.get_mut(&key) {
            (s.count, s.last) = (count, now);
        }
    }

    fn first(&mut self, key: u64, name: String, now: Timestamp) {
        if self.sent.len() >= SERIES_MAX
            && let Some(oldest) = self.sent.iter().min_by_key(|(_, s)| s.last).map(|(k, _)| *k)
        {
            self.sent.remove(&oldest);
        }
        self.sent.insert(key, Sent { name, count: 1, last: now });
    }
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
    /// Wait (bounded) for the queued Events to be sent. Drop every `Events` handle first, or
    /// this waits the whole bound.
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
        // The queued ones, and the one being sent (the API server may have taken it).
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
    fn repeats_count_on_their_series_and_the_memory_of_them_is_bounded() {
        let t0 = Timestamp::from_second(1_000_000).unwrap();
        let later = |secs: i64| t0 + SignedDuration::from_secs(secs);
        let mut series = Series::default();
        assert_eq!(series.repeat(1, t0), None, "a first Event is created");
        series.first(1, "web.1".into(), t0);
        assert_eq!(series.repeat(1, later(10)), Some(("web.1".into(), 2)), "a repeat counts on the first");
        series.counted(1, 2, later(10));
        assert_eq!(series.repeat(1, later(20)), Some(("web.1".into(), 3)));
        series.counted(1, 3, later(20));
        assert_eq!(series.repeat(2, later(20)), None, "another Event is its own");
        // The series lasts SERIES_TTL from its last repeat.
        assert_eq!(series.repeat(1, later(20 + 359)), Some(("web.1".into(), 4)));
        assert_eq!(series.repeat(1, later(20 + 360)), None, "then a repeat starts a new Event");
        assert!(series.sent.is_empty(), "and the expired ones are forgotten");

        // Thousands of Events within minutes (a burst of new workloads): at most SERIES_MAX
        // are remembered, the oldest forgotten first.
        for i in 0..5000u64 {
            series.first(i, format!("w{i}.1"), later(i as i64 / 100));
        }
        assert_eq!(series.sent.len(), SERIES_MAX);
        assert_eq!(series.repeat(0, later(50)), None, "the oldest went");
        assert_eq!(series.repeat(4999, later(50)), Some(("w4999.1".into(), 2)), "the newest stays");
    }

    #[test]
    fn a_repeat_is_the_same_reason_action_and_object() {
        let object = |uid: &str| ObjectReference {
            kind: Some("ManagedWorkload".into()),
            namespace: Some("a".into()),
            name: Some("web".into()),
            uid: Some(uid.into()),
            ..Default::default()
        };
        let event = |type_, reason: &str, note: &str| Event {
            type_,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        };
        let base = fingerprint(&event(EventType::Normal, "Running", "one"), &object("u1"));
        assert_eq!(base, fingerprint(&event(EventType::Normal, "Running", "two"), &object("u1")), "the note aside");
        for other in [
            fingerprint(&event(EventType::Warning, "Running", "one"), &object("u1")),
            fingerprint(&event(EventType::Normal, "Stopped", "one"), &object("u1")),
            fingerprint(&event(EventType::Normal, "Running", "one"), &object("u2")),
        ] {
            assert_ne!(base, other);
        }
        let reporter = Reporter { controller: "mw-operator".into(), instance: None };
        let made =
            new_event(&reporter, &event(EventType::Warning, "Forbidden", "no"), &object("u1"), Timestamp::UNIX_EPOCH);
        assert_eq!(made.metadata.name.as_deref(), Some("web.0"));
        assert_eq!(made.metadata.namespace.as_deref(), Some("a"));
        assert_eq!(made.type_.as_deref(), Some("Warning"));
        assert_eq!(made.reporting_instance.as_deref(), Some("mw-operator"));
        assert_eq!((made.reason.as_deref(), made.note.as_deref()), (Some("Forbidden"), Some("no")));
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
