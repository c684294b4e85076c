//! The one step every owned object goes through (Deployment, Service, NetworkPolicy, each
//! claim): observe (cache, or a GET when the cache cannot tell) → decide (`plan`) → apply →
//! judge the answer (`plan::judge`). The result is a `Verdict`; `Verdict::judge` turns it into
//! what it means for the workload, the same way for every kind. A kind adds only its reasons
//! and conflict message (`Owned`). See docs/architecture.md, "One reconcile".

use std::borrow::Cow;
use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use kube::api::Patch;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::info;

use super::context::Context;
use super::drift::Live;
use super::ownership::{FIELD_MANAGER, is_controlled_by};
use super::plan::{self, Decision, Mode, Refusal};
use super::slim::{CachedClaim, CachedDeployment, CachedService};
use super::status::Blocked;
use crate::error::{Error, Operation};
use crate::metrics::Metrics;
use crate::resource::ManagedWorkload;
use crate::write::Write;

/// An owned kind as the step sees it: its cached form, its cache, how it is written and how
/// its failures are named.
pub trait Owned:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + k8s_openapi::Resource
    + Clone
    + Serialize
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// What the operator's cache keeps of one.
    type Cached: Live + Resource<DynamicType = ()> + Clone + From<Self> + Send + Sync + 'static;

    /// The operator's cache of the kind. Label-selected, so "not there" may mean absent, just
    /// made, or someone else's object of that name.
    fn cache(ctx: &Context) -> &Store<Self::Cached>;

    /// The newest the operator knows of, given what the cache holds.
    fn newest(_ctx: &Context, _mw: &ManagedWorkload, cached: Option<Self::Cached>) -> Option<Self::Cached> {
        cached
    }

    /// The write `mode` asks for, to the live object of UID `uid` (`None`: none); the shared
    /// apply unless the kind needs more.
    fn act(
        ctx: &Context,
        api: &Api<Self>,
        name: &str,
        desired: &Self,
        mode: Mode,
        uid: Option<&str>,
    ) -> impl Future<Output = Result<Self, kube::Error>> + Send {
        apply(&ctx.metrics, api, name, desired, mode.write(uid))
    }

    /// Status reasons for a conflict (someone else's object of its name) and for a refusal.
    const CONFLICT: &'static str;
    const REJECTED: &'static str;

    /// What the status says of a conflict over `name`: whose it is and what to do.
    fn conflict(mw: &ManagedWorkload, name: &str, live: Option<&Self::Cached>) -> String;

    /// An object was applied (or read after an apply whose answer was lost): what the kind keeps
    /// of it until its cache catches up.
    fn applied(_ctx: &Context, _mw: &ManagedWorkload, _applied: &Self::Cached) {}
}

/// What the step came to for one object.
#[derive(Debug)]
pub enum Verdict<'d, K: Owned, L> {
    /// The kind left the object alone, for its own reason `L`; the object as it is.
    Left(L, Option<K::Cached>),
    /// Someone else's object of that name: never touched.
    Conflict(Option<K::Cached>),
    /// One of that name is on its way out: waited for.
    Departing,
    /// It is what the workload wants: no write.
    UpToDate(Option<K::Cached>),
    /// Applied as `Mode` says; the object as the API server returned it.
    Applied(K, Mode),
    /// The API server refused the apply of `desired`, in its own words; the object as it was.
    Rejected { desired: Cow<'d, K>, live: Option<K::Cached>, mode: Mode, message: String },
    /// One appeared during the create and was gone when looked up: look again soon.
    Requeue(Duration),
}

/// Where a kind's part of a reconcile leaves it: done, or look again after a while.
pub enum Flow<T> {
    Done(T),
    Requeue(Duration),
}

/// What a verdict means for the workload.
pub enum Judged<C, L> {
    /// The object as it now is (`None`: none the workload may use), why it is blocked, and how
    /// it was written, if it was.
    Done { live: Option<C>, blocked: Option<Blocked>, written: Option<Mode> },
    /// The kind left it alone, for its own reason.
    Left(L, Option<C>),
    /// Look again after this long.
    Requeue(Duration),
}

impl<K: Owned, L> Verdict<'_, K, L> {
    /// What the verdict means for `mw`, the same for every kind: someone else's object blocks it
    /// and is never touched, a departing one is waited for, a refusal is reported in the API
    /// server's words, and corrected drift gets an Event.
    pub fn judge(self, ctx: &Context, mw: &ManagedWorkload, name: &str) -> Judged<K::Cached, L> {
        let done = |live, blocked, written| Judged::Done { live, blocked, written };
        match self {
            Verdict::Left(left, live) => Judged::Left(left, live),
            Verdict::Conflict(live) => {
                done(None, Some(Blocked::conflict(K::CONFLICT, K::conflict(mw, name, live.as_ref()))), None)
            }
            Verdict::Departing => done(None, Some(Blocked::departing(K::KIND, name)), None),
            Verdict::UpToDate(live) => done(live, None, None),
            Verdict::Applied(applied, mode) => {
                let applied = K::Cached::from(applied);
                K::applied(ctx, mw, &applied);
                info!(kind = %K::KIND, %name, verb = if mode.force() { "updated" } else { "created" }, "applied");
                // Spec changes are announced by the phase change they cause; an edit made behind
                // the operator's back gets its own Event.
                if mode == (Mode::Update { drift: true }) {
                    let note = format!("{} {name} was changed outside the operator; restored", K::KIND);
                    ctx.events.send(mw.object_ref(&()), EventType::Normal, "DriftCorrected", &note);
                }
                done(Some(applied), None, Some(mode))
            }
            Verdict::Rejected { live, message, .. } => {
                done(live, Some(Blocked::rejected(K::REJECTED, K::KIND, name, &message)), None)
            }
            Verdict::Requeue(after) => Judged::Requeue(after),
        }
    }
}

/// The object a kind wants given the live one, and what to do; or its reason to leave it.
pub type Intent<'d, K, L> = Result<(Cow<'d, K>, Decision), L>;

/// One object's step: observe, then while `intent` wants a change, apply and judge the answer.
pub async fn step<'d, K: Owned, L>(
    ctx: &Context,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
    intent: impl FnMut(Option<&K::Cached>) -> Intent<'d, K, L>,
) -> Result<Verdict<'d, K, L>, Error> {
    step_beside(ctx, mw, namespace, name, intent, |_| std::future::ready(())).await
}

/// `step`, running `beside` while the first apply is in flight, given the object as it was
/// before (the Deployment's step writes the new phase meanwhile).
pub async fn step_beside<'d, K: Owned, L, F: Future<Output = ()>>(
    ctx: &Context,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
    mut intent: impl FnMut(Option<&K::Cached>) -> Intent<'d, K, L>,
    beside: impl FnOnce(Option<&K::Cached>) -> F,
) -> Result<Verdict<'d, K, L>, Error> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let mut live = observe(ctx, &api, mw, namespace, name).await?;
    let mut beside = Some(beside);
    loop {
        let (desired, mode) = match intent(live.as_ref()) {
            Err(left) => return Ok(Verdict::Left(left, live)),
            Ok((_, Decision::Conflict)) => return Ok(Verdict::Conflict(live)),
            Ok((_, Decision::Departing)) => return Ok(Verdict::Departing),
            Ok((_, Decision::UpToDate)) => return Ok(Verdict::UpToDate(live)),
            Ok((desired, Decision::Apply(mode))) => (desired, mode),
        };
        let uid = live.as_ref().and_then(|l| l.meta().uid.clone());
        let write = K::act(ctx, &api, name, &desired, mode, uid.as_deref());
        let answer = match beside.take() {
            Some(beside) => tokio::join!(write, beside(live.as_ref())).0,
            None => write.await,
        };
        let source = match answer {
            Ok(applied) => return Ok(Verdict::Applied(applied, mode)),
            Err(source) => source,
        };
        match plan::judge(&source) {
            Refusal::Another => {
                info!(kind = %K::KIND, %name, "another object of that name than the one decided on; looking it up");
                live = get(&api, namespace, name).await?;
                if live.is_none() {
                    return Ok(Verdict::Requeue(plan::APPEARED_RECHECK));
                }
            }
            Refusal::Rejected(message) => return Ok(Verdict::Rejected { desired, live, mode, message }),
            Refusal::Retry => {
                if answer_lost(&source) {
                    ctx.caches.objects.unanswered(mw, K::KIND, name);
                }
                return Err(Error::owned(Operation::Apply, K::KIND, namespace, name, source));
            }
        }
    }
}

/// An object the workload has one or none of (its Service, its NetworkPolicy): `desired`
/// through the step, or, when none is wanted, its own one removed. Returns the object as it
/// now is (`None`: none the workload may use) and why it is blocked.
pub async fn ensure<K: Owned>(
    ctx: &Context,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
    desired: Option<K>,
) -> Result<Flow<(Option<K::Cached>, Option<Blocked>)>, Error> {
    let Some(desired) = desired else {
        remove::<K>(ctx, mw, namespace, name).await?;
        return Ok(Flow::Done((None, None)));
    };
    let verdict = step::<K, std::convert::Infallible>(ctx, mw, namespace, name, |live| {
        Ok((Cow::Borrowed(&desired), plan::decide(mw, &desired, live)))
    })
    .await?;
    Ok(match verdict.judge(ctx, mw, name) {
        Judged::Left(never, _) => match never {},
        Judged::Done { live, blocked, .. } => Flow::Done((live, blocked)),
        Judged::Requeue(after) => Flow::Requeue(after),
    })
}

/// Delete the workload's own object of `name`, if the cache holds one. Bound to its UID, so
/// one made by someone else under that name since is never deleted; already gone is no error.
async fn remove<K: Owned>(ctx: &Context, mw: &ManagedWorkload, namespace: &str, name: &str) -> Result<(), Error> {
    let Some(cached) = K::cache(ctx).get(&ObjectRef::new(name).within(namespace)) else { return Ok(()) };
    if !is_controlled_by(&*cached, mw) || cached.meta().deletion_timestamp.is_some() {
        return Ok(());
    }
    let Some(uid) = cached.meta().uid.as_deref() else { return Ok(()) };
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let answer = crate::write::delete_by_uid(&api, name, uid).await;
    ctx.metrics.sent(K::URL_PATH_SEGMENT, "delete", &answer);
    match answer {
        Ok(deleted) => {
            if deleted {
                info!(kind = %K::KIND, %name, "deleted: the workload no longer asks for it");
            }
            Ok(())
        }
        Err(source) => Err(Error::owned(Operation::Delete, K::KIND, namespace, name, source)),
    }
}

/// The live object, the newest the operator knows of. The caches have synced (a controller
/// starts only then), but they are label-selected, so "not there" may be someone else's
/// object. A workload with no status yet has none of its own and the create-only apply
/// guards against others' (a 409 leads to a GET), so no GET precedes its create. Otherwise
/// one GET tells.
async fn observe<K: Owned>(
    ctx: &Context,
    api: &Api<K>,
    mw: &ManagedWorkload,
    namespace: &str,
    name: &str,
) -> Result<Option<K::Cached>, Error> {
    // An apply whose answer was lost may have been carried out: only the API server can say.
    if ctx.caches.objects.is_unanswered(mw, K::KIND, name) {
        let live = get(api, namespace, name).await?;
        ctx.caches.objects.looked_up(mw, K::KIND, name);
        // Kept like an applied object: the cache may lag behind for a while (its watch re-lists
        // after an outage) and must not undo what was learnt here.
        if let Some(live) = &live {
            K::applied(ctx, mw, live);
        }
        return Ok(live);
    }
    let cached = K::cache(ctx).get(&ObjectRef::new(name).within(namespace)).map(|c| (*c).clone());
    match K::newest(ctx, mw, cached) {
        Some(live) => Ok(Some(live)),
        None if ctx.caches.previous_status(mw).is_none() => Ok(None),
        None => get(api, namespace, name).await,
    }
}

/// The request went out and no answer came (connection broke, or the wait timed out): it
/// may have been carried out. hyper says `client error (Connect)` when no connection was
/// made; a `kube::Error::Api` is the API server's own answer.
fn answer_lost(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Service(_) | kube::Error::HyperError(_))
        && !crate::check::error_chain(err).contains("(Connect)")
}

async fn get<K: Owned>(api: &Api<K>, namespace: &str, name: &str) -> Result<Option<K::Cached>, Error> {
    let found =
        api.get_opt(name).await.map_err(|source| Error::owned(Operation::Get, K::KIND, namespace, name, source))?;
    Ok(found.map(K::Cached::from))
}

/// Server-side apply `desired` under the operator's field manager, counted as a write of its
/// kind: create only where none exists, or force onto the object of the UID decided on
/// (`Write`). A lagging cache may still show an object someone has since deleted and made
/// again under that name: theirs is never changed.
pub async fn apply<K: Owned>(
    metrics: &Metrics,
    api: &Api<K>,
    name: &str,
    desired: &K,
    write: Write<'_>,
) -> Result<K, kube::Error> {
    let answer = write.apply(api, name, desired, FIELD_MANAGER).await;
    metrics.sent(K::URL_PATH_SEGMENT, "apply", &answer);
    answer
}

impl Owned for Deployment {
    type Cached = CachedDeployment;
    const CONFLICT: &'static str = "DeploymentConflict";
    const REJECTED: &'static str = "DeploymentRejected";

    fn conflict(_mw: &ManagedWorkload, name: &str, _live: Option<&CachedDeployment>) -> String {
        format!(
            "a Deployment named {name} already exists and is not controlled by this ManagedWorkload; \
             delete or rename it, or rename the ManagedWorkload"
        )
    }

    /// Kept until the cache catches up (`newest`).
    fn applied(ctx: &Context, mw: &ManagedWorkload, applied: &CachedDeployment) {
        ctx.caches.objects.applied(mw, applied.clone());
    }

    fn cache(ctx: &Context) -> &Store<CachedDeployment> {
        &ctx.caches.deployments
    }

    /// What the last apply returned, while the cache lags behind it.
    fn newest(ctx: &Context, mw: &ManagedWorkload, cached: Option<CachedDeployment>) -> Option<CachedDeployment> {
        ctx.caches.objects.newest_deployment(mw, cached)
    }
}

impl Owned for Service {
    type Cached = CachedService;
    const CONFLICT: &'static str = "ServiceConflict";
    const REJECTED: &'static str = "ServiceRejected";

    fn conflict(_mw: &ManagedWorkload, name: &str, _live: Option<&CachedService>) -> String {
        format!(
            "a Service named {name} already exists and is not controlled by this ManagedWorkload; it is left \
             untouched: delete or rename it, or rename the ManagedWorkload (or remove spec.service)"
        )
    }

    fn cache(ctx: &Context) -> &Store<CachedService> {
        &ctx.caches.services
    }

    /// On drift, first set the ports list whole: a port someone added or renamed by hand is
    /// theirs under server-side apply, so an apply would leave it (or fail when it reuses one of
    /// our names). Then apply as usual.
    async fn act(
        ctx: &Context,
        api: &Api<Service>,
        name: &str,
        desired: &Service,
        mode: Mode,
        uid: Option<&str>,
    ) -> Result<Service, kube::Error> {
        if mode == (Mode::Update { drift: true }) {
            let ports = desired.spec.as_ref().map(|s| s.ports.clone());
            let params = crate::client::patch_params(FIELD_MANAGER);
            // Bound to the UID, like the apply (`Write::Update`).
            let patch = serde_json::json!({ "metadata": { "uid": uid }, "spec": { "ports": ports } });
            let answer = api.patch(name, &params, &Patch::Merge(patch)).await;
            ctx.metrics.sent("services", "patch", &answer);
            answer?;
        }
        apply(&ctx.metrics, api, name, desired, mode.write(uid)).await
    }
}

impl Owned for PersistentVolumeClaim {
    type Cached = CachedClaim;
    const CONFLICT: &'static str = "ClaimConflict";
    const REJECTED: &'static str = "ClaimRejected";

    fn conflict(mw: &ManagedWorkload, name: &str, live: Option<&CachedClaim>) -> String {
        super::volumes::conflict(mw, name, live)
    }

    fn cache(ctx: &Context) -> &Store<CachedClaim> {
        &ctx.caches.claims
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_request_that_went_out_may_have_been_carried_out() {
        let service = |text: &str| kube::Error::Service(text.to_string().into());
        // As kube 3 words them (seen when kube-apiserver stopped mid-request).
        assert!(answer_lost(&service("client error (SendRequest)")));
        assert!(answer_lost(&service("operation timed out")));
        assert!(!answer_lost(&service("client error (Connect)")));
        let refused = kube::core::Status::failure("conflict", "Conflict").with_code(409).boxed();
        assert!(!answer_lost(&kube::Error::Api(refused)));
    }
}
