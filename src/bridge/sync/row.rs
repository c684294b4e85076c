//! One row's sync: its Secret, then its CR, each create-only or bound to the UID decided on;
//! what is someone else's is reported, never taken over.

use super::*;

/// What a row's sync needs to know of the others: which rows exist (`live`), and which CRs
/// the deletion guard lets this pass delete (`deletable`, by UID).
#[derive(Clone, Copy)]
pub(super) struct Known<'a> {
    pub(super) live: &'a HashSet<RowKey>,
    pub(super) deletable: &'a HashSet<String>,
}

pub(super) async fn sync_one(
    cluster: &Cluster,
    fm: &str,
    desired: Desired,
    cached: Option<Existing>,
    secret_cached: Option<Arc<CachedSecret>>,
    known: Known<'_>,
) -> Outcome {
    let mut result = try_sync_one(cluster, fm, &desired, cached, secret_cached, known).await;
    if let Err(Failure::Appeared(likely)) = &result {
        // A create found an object of that name after all, or an update found another object than
        // it read: a fresh read tells whose it is.
        debug!(likely = %likely, "an object appeared while writing; reading it again");
        result = try_sync_one(cluster, fm, &desired, None, None, known).await;
    }
    match result {
        Ok(outcome) => outcome,
        Err(Failure::Row(err)) => Outcome::Row(err),
        // Twice in a row: reported as what it most likely is, and retried.
        Err(Failure::Appeared(err)) => Outcome::Row(err),
        Err(Failure::Api(operation, source)) => Outcome::Transient(BridgeError::Kube { operation, source }),
    }
}

enum Failure {
    Row(RowError),
    /// A write found another object than it was for (`write::found_another`); with the row
    /// error that most likely means (`NameTaken`, `SecretTaken`).
    Appeared(RowError),
    Api(String, kube::Error),
}

async fn try_sync_one(
    cluster: &Cluster,
    fm: &str,
    d: &Desired,
    cached: Option<Existing>,
    secret_cached: Option<Arc<CachedSecret>>,
    known: Known<'_>,
) -> Result<Outcome, Failure> {
    let (ns, name) = (d.namespace.as_str(), d.name.as_str());
    let api = |what: &str| {
        let what = what.to_string();
        move |e: kube::Error| classify(e, what)
    };
    // Not in the cache of our own CRs: absent, not seen yet, or someone else's.
    let existing = match cached {
        Some(e) => Some(e),
        None => cluster
            .get_workload(ns, name)
            .await
            .map_err(api(&format!("reading ManagedWorkload {ns}/{name}")))?
            .map(|mw| Existing::of(&CachedWorkload::from(mw), fm)),
    };
    let name_taken = || RowError::NameTaken { namespace: ns.into(), name: name.into() };
    let secret_taken = || RowError::SecretTaken { namespace: ns.into(), name: d.secret_name.clone() };
    // Not in the cache of our own Secrets: absent, not seen yet, or someone else's.
    let secret = match secret_cached {
        Some(secret) => Some(secret),
        None => match cluster
            .get_secret(ns, &d.secret_name)
            .await
            .map_err(api(&format!("reading Secret {ns}/{}", d.secret_name)))?
        {
            Some(meta) if !MadeBy::of(meta.labels()).bridge(fm) => {
                stop_using_anothers_secret(cluster, existing.as_ref(), d).await?;
                return Ok(Outcome::Row(secret_taken()));
            }
            found => found.map(|meta| Arc::new(CachedSecret::from(meta))),
        },
    };
    // 409 on a create-only write (an object of that name exists after all) or on a write for a
    // UID the object no longer has (re-made since). Not the row's error yet: a fresh read tells
    // whose the object is.
    let write = |what: String, taken: RowError| {
        move |e: kube::Error| if found_another(&e) { Failure::Appeared(taken) } else { classify(e, what) }
    };
    let secret_uid = secret.as_ref().and_then(|s| s.meta().uid.clone());
    match plan::plan(d, existing.as_ref(), secret.as_deref(), |k| known.live.contains(&k)) {
        Plan::UpToDate => Ok(Outcome::Synced),
        Plan::Blocked(err) => Ok(Outcome::Row(err)),
        Plan::Replace { uid } if !known.deletable.contains(&uid) => {
            Ok(Outcome::Row(RowError::AwaitingDeletion { namespace: ns.into(), name: name.into(), uid }))
        }
        Plan::Replace { uid } => {
            info!("ManagedWorkload {ns}/{name} stands for an earlier container; deleting it to create this one");
            cluster
                .delete_workload(ns, name, &uid)
                .await
                .map_err(api(&format!("deleting ManagedWorkload {ns}/{name}")))?;
            Ok(Outcome::Row(RowError::Replacing { namespace: ns.into(), name: name.into() }))
        }
        Plan::Create => {
            // The Secret first, so no Pod of the new workload starts with values not its own. A
            // Secret of ours of that name that serves no CR yet (an earlier container's, or one
            // whose CR was never made) is deleted by UID before anything is written. Then the
            // Secret and the CR (both create-only), then the Secret's owner. If a later write
            // fails, the next pass finds the CR without a serving Secret (`Plan::Update`).
            let secret = mapping::secret(d, fm, None);
            cluster.create_with_secret(&d.workload, secret, secret_uid.as_deref()).await.map_err(
                |(step, e)| match step {
                    CreateStep::Earlier => api(&format!("deleting the earlier Secret {ns}/{}", d.secret_name))(e),
                    CreateStep::Secret => write(format!("writing Secret {ns}/{}", d.secret_name), secret_taken())(e),
                    CreateStep::Workload => write(format!("creating ManagedWorkload {ns}/{name}"), name_taken())(e),
                    CreateStep::Undo => {
                        api(&format!("deleting Secret {ns}/{}, the CR's name being taken", d.secret_name))(e)
                    }
                    CreateStep::Owner => {
                        write(format!("giving Secret {ns}/{} its owner", d.secret_name), secret_taken())(e)
                    }
                },
            )?;
            info!("created ManagedWorkload {ns}/{name}");
            Ok(Outcome::Synced)
        }
        Plan::Update => {
            let uid = existing.and_then(|e| e.uid);
            let mut owner = d.workload.clone();
            owner.metadata.uid = uid.clone();
            // The Secret first, so the CR never asks for env its Secret lacks; bound to the UID
            // read (or created where there is none).
            let secret_write = match &secret_uid {
                Some(uid) => Write::Update { uid: Some(uid) },
                None => Write::Create,
            };
            let secret = mapping::secret(d, fm, mapping::owner_reference(&owner));
            cluster
                .apply(&secret, secret_write, "secret_apply")
                .await
                .map_err(write(format!("applying Secret {ns}/{}", d.secret_name), secret_taken()))?;
            // Bound to the UID read: a CR re-made by someone else since (a stale cache) answers 409
            // instead of being forced over.
            cluster
                .apply(&owner, Write::Update { uid: uid.as_deref() }, "workload_apply")
                .await
                .map_err(write(format!("applying ManagedWorkload {ns}/{name}"), name_taken()))?;
            info!("updated ManagedWorkload {ns}/{name}");
            Ok(Outcome::Synced)
        }
    }
}

/// The row's Secret name holds someone else's Secret, made after ours was deleted. Our CR
/// would start its next Pod with their values, so it is deleted by UID and made again once
/// the name is free. Its disk is retained and comes back with it.
async fn stop_using_anothers_secret(
    cluster: &Cluster,
    existing: Option<&Existing>,
    d: &Desired,
) -> Result<(), Failure> {
    let (ns, name) = (d.namespace.as_str(), d.name.as_str());
    let Some(uid) = existing.filter(|cr| cr.ours && !cr.deleting).and_then(|cr| cr.uid.as_deref()) else {
        return Ok(());
    };
    warn!(
        "Secret {ns}/{} is not the bridge's; deleting ManagedWorkload {ns}/{name}, whose Pod would start with it",
        d.secret_name
    );
    cluster
        .delete_workload(ns, name, uid)
        .await
        .map_err(|e| classify(e, format!("deleting ManagedWorkload {ns}/{name}, its Secret being someone else's")))
}

/// The API server refusing the object (400, 422) is the row's problem and waits for the row
/// to change; anything else (down, throttled, 5xx) is retried with the whole pass.
/// `operation` names the object ("applying Secret ns/x-manager-env").
fn classify(err: kube::Error, operation: String) -> Failure {
    match err {
        kube::Error::Api(s) if s.code == 400 || s.code == 422 => {
            Failure::Row(RowError::Rejected { object: operation, message: s.message })
        }
        other => Failure::Api(operation, other),
    }
}
