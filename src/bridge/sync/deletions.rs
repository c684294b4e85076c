//! The deletion side of a pass: which CRs of this bridge lost their row, what the deletion
//! guard (`plan::DeleteGuard`) lets this pass delete, and the deletes, each bound to its UID.

use super::*;
use crate::names::{APPROVE_DELETION_ANNOTATION, SYNCED_BY_LABEL};

/// A CR of this bridge whose row is gone.
pub(super) struct Orphan {
    namespace: String,
    name: String,
    pub(super) uid: String,
    key: Option<RowKey>,
    /// Its approval annotation (`APPROVE_DELETION_ANNOTATION`), if set.
    approval: Option<String>,
}

/// Up to ten `namespace/name`s of `orphans`, for a log line, and how many more.
fn named(orphans: &[Orphan]) -> String {
    const SHOWN: usize = 10;
    let mut text =
        orphans.iter().take(SHOWN).map(|o| format!("{}/{}", o.namespace, o.name)).collect::<Vec<_>>().join(", ");
    if orphans.len() > SHOWN {
        text.push_str(&format!(" and {} more", orphans.len() - SHOWN));
    }
    text
}

impl Bridge {
    /// The CRs this bridge made whose row is gone (or belongs elsewhere now).
    fn orphans(&self) -> Vec<Orphan> {
        let fm = &self.settings.field_manager;
        let target = |key: RowKey| {
            self.rows.get(&key).map(|t| plan::RowTarget {
                created_at: t.row.created_at.clone(),
                namespace: t.namespace.clone(),
                name: t.row.hostname.clone(),
            })
        };
        let mut orphans = Vec::new();
        for mw in self.cluster.workloads() {
            let existing = Existing::of(&mw, fm);
            if !plan::is_orphan(&existing, |node| self.served.contains_key(&node), target) {
                continue;
            }
            if let (Some(namespace), Some(uid)) = (mw.namespace(), existing.uid) {
                orphans.push(Orphan {
                    namespace,
                    name: mw.name_any(),
                    uid,
                    key: existing.key,
                    approval: mw.approval.clone(),
                });
            }
        }
        orphans.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        orphans
    }

    /// How many CRs of this bridge, not being deleted, stand for rows of the nodes it serves:
    /// what the deletion guard's share is of.
    fn owned(&self) -> usize {
        let fm = &self.settings.field_manager;
        self.cluster
            .workloads()
            .iter()
            .filter(|mw| mw.meta().deletion_timestamp.is_none())
            .filter(|mw| plan::made_for(mw, fm).is_some_and(|(key, _)| self.served.contains_key(&key.node_id)))
            .count()
    }

    /// After a full read: put the CRs whose row is gone before the deletion guard, say what
    /// it decided (once per change), and return the ones it lets this pass delete.
    pub(super) fn judge_deletions(&mut self) -> Vec<Orphan> {
        let orphans = self.orphans();
        let found = orphans.iter().map(|o| (o.uid.clone(), o.approval.clone())).collect();
        let owned = self.owned();
        let guard = self.settings.delete_guard;
        let now = Instant::now();
        let judgement = guard.judge(self.deletions.as_ref(), &found, owned, now.into_std());
        let names = || named(&orphans);
        let fresh = |s: &Sighting| self.deletions.as_ref().is_none_or(|d| d.uids != s.uids);
        match &judgement {
            Judgement::Nothing => {
                if self.deletions.is_some() {
                    info!(
                        "no ManagedWorkload is to be deleted any more (their rows are back, or they went otherwise); nothing was deleted"
                    );
                }
                self.metrics.set_deletions_pending(0, 0);
            }
            Judgement::Unconfirmed { sighting, recheck_at } => {
                if fresh(sighting) {
                    info!(
                        count = orphans.len(),
                        workloads = %names(),
                        confirm_in = ?recheck_at.saturating_duration_since(now.into_std()),
                        "rows are gone; their ManagedWorkloads are deleted once a second full read agrees"
                    );
                }
                self.metrics.set_deletions_pending(orphans.len(), 0);
            }
            Judgement::Delete { .. } => self.metrics.set_deletions_pending(0, 0),
            Judgement::Held { token, approved, .. } => {
                if self.held.as_ref() != Some(token) {
                    warn!(
                        deleting = orphans.len(),
                        owned,
                        max_percent = guard.max_percent,
                        approved,
                        workloads = %names(),
                        "holding back the deletion of {} of the bridge's {owned} ManagedWorkloads (more than {}%): is this \
                         the right Manager database? Everything else goes on syncing. If the rows really are gone, approve \
                         exactly these deletions with `kubectl annotate mw -A -l {SYNCED_BY_LABEL}={} \
                         {APPROVE_DELETION_ANNOTATION}={token} --overwrite`, or run the bridge with --max-delete-percent 100",
                        orphans.len(),
                        guard.max_percent,
                        self.settings.field_manager,
                    );
                }
                self.metrics.set_deletions_pending(0, orphans.len());
            }
        }
        self.held = match &judgement {
            Judgement::Held { token, .. } => Some(token.clone()),
            _ => None,
        };
        self.deletions = judgement.sighting().cloned();
        if matches!(judgement, Judgement::Delete { .. }) { orphans } else { Vec::new() }
    }

    /// Delete the CRs the deletion guard let go, and Secrets this bridge wrote whose CR never
    /// came (a crash between the two writes).
    pub(super) async fn collect_orphans(&mut self, deleting: Vec<Orphan>) -> Result<(), BridgeError> {
        for Orphan { namespace: ns, name, uid, key, .. } in deleting {
            info!(namespace = %ns, name = %name, row = ?key, "row is gone; deleting its ManagedWorkload");
            self.cluster.delete_workload(&ns, &name, &uid).await.map_err(|source| BridgeError::Kube {
                operation: format!("deleting ManagedWorkload {ns}/{name}"),
                source,
            })?;
        }
        // A Secret's age is its creationTimestamp, stamped by the API server: judged by the
        // API server's clock, never this machine's, which may be off from it.
        let server_now = match self.cluster.server_time().await {
            Ok(now) => now,
            Err(err) => {
                warn!(error = %err, "cannot read the API server's clock; orphaned env Secrets wait for the next full resync");
                return Ok(());
            }
        };
        let secrets = self.cluster.secrets();
        let workloads = self.cluster.workloads();
        let names = workloads.iter().filter_map(|mw| Some((mw.namespace()?, mw.name_any())));
        let orphaned =
            plan::orphan_secrets(secrets.iter().map(|s| &**s), names, &self.settings.field_manager, server_now);
        for secret in orphaned {
            let meta = secret.meta();
            let (Some(ns), Some(name), Some(uid)) = (&meta.namespace, &meta.name, &meta.uid) else { continue };
            info!(namespace = %ns, name = %name, "deleting an env Secret whose ManagedWorkload was never created");
            self.cluster
                .delete_secret(ns, name, uid)
                .await
                .map_err(|source| BridgeError::Kube { operation: format!("deleting Secret {ns}/{name}"), source })?;
        }
        Ok(())
    }
}
