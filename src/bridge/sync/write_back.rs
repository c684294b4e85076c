//! The write-back: each CR's provider id and address to its Manager row.

use super::*;

impl Bridge {
    /// Write each CR's provider id and address to its row where they differ.
    pub(super) async fn write_back(&mut self) -> Result<(), BridgeError> {
        let fm = self.settings.field_manager.clone();
        let stale_after = Instant::now() - ROW_RETRY;
        for (key, t) in self.rows.iter_mut() {
            // A container held in its node's previous namespace runs there: its row keeps what it
            // says, including the address Manager's agent reaches it at.
            if matches!(t.error, Some(RowError::NodeMoved { .. })) {
                continue;
            }
            // Also for a row in error: its workload (from an earlier, good version of the row) may
            // still run, and the row must follow it.
            let cr = self
                .cluster
                .workload(&t.namespace, &t.row.hostname)
                .filter(|mw| plan::made_for(mw, &fm) == Some((*key, Some(t.row.created_at.as_str()))));
            // Synced a while ago and gone now: deleted by hand. Create it again (a row in
            // error waits for its fix instead).
            if cr.is_none() && t.error.is_none() && !t.pending && t.synced_at.is_some_and(|at| at < stale_after) {
                info!(row = %key, hostname = %t.row.hostname, "ManagedWorkload is gone but its row is not; creating it again");
                t.pending = true;
            }
            let target = plan::write_back_target(cr.as_deref(), &t.row.written(), self.settings.address);
            if target == t.row.written() {
                continue;
            }
            match self.db.write_back(&t.row, &target).await {
                Ok(written) => {
                    if let Some(updated_at) = written {
                        info!(row = %key, hostname = %t.row.hostname, container_id = ?target.container_id, ipv4_address = ?target.ipv4_address, "wrote back to Manager");
                        t.own_stamp = Some(updated_at.clone());
                        t.row.updated_at = updated_at;
                        self.metrics.wrote("row_update");
                    }
                    // Also when nothing was written (the row already held it): do not retry.
                    t.row.container_id = target.container_id;
                    t.row.ipv4_address = target.ipv4_address;
                    t.row.mac_address = None;
                    if let Some(err) = t.write_back_error.take() {
                        info!(row = %key, was = %err.reason(), "write-back succeeded again");
                    }
                }
                Err(WriteBackError::Row(err)) => {
                    report(&self.metrics, *key, &t.row.hostname, &mut t.write_back_error, err)
                }
                Err(WriteBackError::Bridge(err)) => return Err(err),
            }
        }
        Ok(())
    }
}
