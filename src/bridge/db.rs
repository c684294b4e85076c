//! Manager's database, PostgreSQL or SQLite, through sqlx. I/O only: each query returns the
//! plain rows of `rows`. The engines differ in three places (timestamps, a parameter cast,
//! the pool), kept in `Engine`; every statement is otherwise written once for both.

use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use sqlx::ConnectOptions;
use sqlx::error::ErrorKind;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgSslMode};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use super::error::{BridgeError, RowError};
use super::rows::{ContainerRow, Fingerprint, GrantRow, NodeRow, RowState};

/// A connection pool to Manager's database.
#[derive(Clone, Debug)]
pub enum Database {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

/// Which SQL dialect a statement is rendered for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Postgres,
    Sqlite,
}

/// Run the same statement on whichever pool this is. `$pool` is bound to the concrete pool,
/// so sqlx checks the row types for each engine separately.
macro_rules! on_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            Database::Postgres($pool) => $body,
            Database::Sqlite($pool) => $body,
        }
    };
}

impl Engine {
    /// A timestamp column or expression as text in Sequelize's form, UTC.
    /// PostgreSQL keeps microseconds (so the text compares back exactly); SQLite holds the
    /// text Manager wrote.
    fn ts(self, expr: &str) -> String {
        match self {
            Engine::Postgres => {
                format!("to_char(({expr}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || ' +00:00'")
            }
            Engine::Sqlite => format!("CAST({expr} AS TEXT)"),
        }
    }

    /// Parameter `n` where a timestamp is expected.
    fn ts_param(self, n: u8) -> String {
        match self {
            Engine::Postgres => format!("CAST(${n} AS timestamptz)"),
            Engine::Sqlite => format!("${n}"),
        }
    }

    /// A moment in the text form this engine's timestamps compare with. SQLite compares the
    /// text Sequelize writes (milliseconds, explicit offset), so ours must be the same.
    pub fn format(self, at: Timestamp) -> String {
        let digits = match self {
            Engine::Postgres => "%.6f",
            Engine::Sqlite => "%.3f",
        };
        // Truncate rather than round: a bound rounded up could skip a row.
        let at = at
            .round(
                k8s_openapi::jiff::TimestampRound::new()
                    .smallest(k8s_openapi::jiff::Unit::Microsecond)
                    .mode(k8s_openapi::jiff::RoundMode::Trunc),
            )
            .unwrap_or(at);
        format!("{} +00:00", at.strftime(&format!("%Y-%m-%d %H:%M:%S{digits}")))
    }
}

/// Parse a timestamp as rendered by `Engine::ts` or written by Sequelize.
pub fn parse_timestamp(text: &str) -> Option<Timestamp> {
    k8s_openapi::jiff::fmt::strtime::parse("%Y-%m-%d %H:%M:%S%.f %:z", text.trim()).ok()?.to_timestamp().ok()
}

/// How to reach the database.
#[derive(Clone)]
pub struct Target {
    /// `postgres://user@host:port/db?sslmode=verify-full&sslrootcert=/ca.crt` or
    /// `sqlite:///path/to/database.sqlite`. Never holds a password.
    pub url: String,
    pub password: Option<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &self.url)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

const SELECT_CONTAINER: &str = r#"CAST(c.id AS BIGINT) AS id, CAST(c."nodeId" AS BIGINT) AS node_id,
  CAST(c."siteId" AS BIGINT) AS site_id, c.hostname AS hostname, c.username AS username,
  c.template AS template, c."environmentVars" AS environment_vars, c.entrypoint AS entrypoint,
  CAST(CASE WHEN c."nvidiaRequested" THEN 1 ELSE 0 END AS BIGINT) AS nvidia_requested,
  c."containerId" AS container_id, c."ipv4Address" AS ipv4_address, c."macAddress" AS mac_address"#;

fn id_list(ids: &[i64]) -> String {
    ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

impl Database {
    /// A lazily connecting pool: a database that is down at start-up is retried by the sync
    /// loop like one that goes down later. Only a malformed URL fails here.
    pub fn connect(target: &Target) -> Result<Database, BridgeError> {
        let url = target.url.trim();
        if url_has_password(url) {
            return Err(BridgeError::Config(
                "the database URL holds a password; give it with --database-password-file or MW_DATABASE_PASSWORD instead".into(),
            ));
        }
        let bad_url = |e: sqlx::Error| BridgeError::Config(format!("database URL: {e}"));
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let mut options = PgConnectOptions::from_str(url)
                .map_err(bad_url)?
                .application_name("mw-bridge")
                // A hung statement must not stall every row behind it.
                .options([("statement_timeout", "30s"), ("lock_timeout", "10s")])
                .disable_statement_logging();
            if let Some(password) = &target.password {
                options = options.password(password);
            }
            if matches!(options.get_ssl_mode(), PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer) {
                tracing::warn!(
                    "the database connection is not required to use TLS; use sslmode=verify-full in production"
                );
            }
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(10))
                .connect_lazy_with(options);
            Ok(Database::Postgres(pool))
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)
                .map_err(bad_url)?
                // Manager's database: never create one, never change its journal mode.
                .create_if_missing(false)
                .foreign_keys(true)
                // Manager writes the same file; wait for its locks instead of failing.
                .busy_timeout(Duration::from_secs(10))
                .disable_statement_logging();
            let pool = SqlitePoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(10))
                .connect_lazy_with(options);
            Ok(Database::Sqlite(pool))
        } else {
            Err(BridgeError::Config("the database URL must start with postgres://, postgresql:// or sqlite:".into()))
        }
    }

    pub fn engine(&self) -> Engine {
        match self {
            Database::Postgres(_) => Engine::Postgres,
            Database::Sqlite(_) => Engine::Sqlite,
        }
    }

    /// Nodes of type `kubernetes`.
    pub async fn kubernetes_nodes(&self) -> Result<Vec<NodeRow>, BridgeError> {
        let sql = r#"SELECT CAST(id AS BIGINT) AS id, name AS name, CAST("siteId" AS BIGINT) AS site_id
                     FROM "Nodes" WHERE "nodeType" = 'kubernetes' ORDER BY id"#;
        on_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await).map_err(BridgeError::db("reading Nodes"))
    }

    /// `Settings.default_container_env_vars`, when set.
    pub async fn default_env_setting(&self) -> Result<Option<String>, BridgeError> {
        let sql = r#"SELECT value FROM "Settings" WHERE key = 'default_container_env_vars'"#;
        on_pool!(self, pool => sqlx::query_scalar(sql).fetch_optional(pool).await)
            .map_err(BridgeError::db("reading Settings"))
    }

    /// Approved cpu, memory and rootfs requests, oldest approval first.
    pub async fn approved_grants(&self) -> Result<Vec<GrantRow>, BridgeError> {
        let sql = r#"SELECT CAST("siteId" AS BIGINT) AS site_id, hostname AS hostname, username AS username,
                       "resourceType" AS resource_type, CAST(value AS BIGINT) AS value
                     FROM "ResourceRequests"
                     WHERE status = 'approved' AND "resourceType" IN ('cpus', 'memory', 'rootfs')
                     ORDER BY COALESCE("reviewedAt", "updatedAt"), id"#;
        on_pool!(self, pool => sqlx::query_as(sql).fetch_all(pool).await)
            .map_err(BridgeError::db("reading ResourceRequests"))
    }

    /// Containers on `nodes`, all of them or those updated at or after `since`.
    pub async fn containers(&self, nodes: &[i64], since: Option<Timestamp>) -> Result<Vec<ContainerRow>, BridgeError> {
        if nodes.is_empty() {
            return Ok(Vec::new());
        }
        let e = self.engine();
        let mut sql = format!(
            r#"SELECT {SELECT_CONTAINER}, {} AS created_at, {} AS updated_at
               FROM "Containers" c WHERE c."nodeId" IN ({})"#,
            e.ts(r#"c."createdAt""#),
            e.ts(r#"c."updatedAt""#),
            id_list(nodes)
        );
        if since.is_some() {
            sql.push_str(&format!(r#" AND c."updatedAt" >= {}"#, e.ts_param(1)));
        }
        sql.push_str(r#" ORDER BY c."updatedAt", c.id"#);
        let since = since.map(|t| e.format(t));
        on_pool!(self, pool => {
            let mut query = sqlx::query_as(&sql);
            if let Some(since) = &since {
                query = query.bind(since);
            }
            query.fetch_all(pool).await
        })
        .map_err(BridgeError::db("reading Containers"))
    }

    /// Containers on kubernetes nodes this bridge does not serve: (id, nodeId).
    pub async fn unmapped_containers(&self, served: &[i64]) -> Result<Vec<(i64, i64)>, BridgeError> {
        let mut sql = r#"SELECT CAST(c.id AS BIGINT), CAST(c."nodeId" AS BIGINT)
                         FROM "Containers" c JOIN "Nodes" n ON n.id = c."nodeId"
                         WHERE n."nodeType" = 'kubernetes'"#
            .to_string();
        if !served.is_empty() {
            sql.push_str(&format!(r#" AND c."nodeId" NOT IN ({})"#, id_list(served)));
        }
        on_pool!(self, pool => sqlx::query_as(&sql).fetch_all(pool).await)
            .map_err(BridgeError::db("reading Containers on unmapped nodes"))
    }

    /// What an incremental poll cannot see by `updatedAt` alone.
    pub async fn fingerprint(&self, nodes: &[i64]) -> Result<Fingerprint, BridgeError> {
        let e = self.engine();
        let on_nodes =
            if nodes.is_empty() { "1 = 0".to_string() } else { format!(r#""nodeId" IN ({})"#, id_list(nodes)) };
        let sql = format!(
            r#"SELECT
                 (SELECT CAST(COUNT(*) AS BIGINT) FROM "Containers" WHERE {on_nodes}) AS containers,
                 (SELECT CAST(COALESCE(SUM(id), 0) AS BIGINT) FROM "Containers" WHERE {on_nodes}) AS id_sum,
                 (SELECT {} || '/' || CAST(COUNT(*) AS TEXT) FROM "Nodes") AS nodes_updated,
                 (SELECT {} FROM "Settings" WHERE key = 'default_container_env_vars') AS settings_updated,
                 (SELECT {} || '/' || CAST(COUNT(*) AS TEXT) FROM "ResourceRequests") AS grants_updated"#,
            e.ts(r#"MAX("updatedAt")"#),
            e.ts(r#"MAX("updatedAt")"#),
            e.ts(r#"MAX("updatedAt")"#),
        );
        on_pool!(self, pool => sqlx::query_as(&sql).fetch_one(pool).await).map_err(BridgeError::db("polling"))
    }

    /// Write the bridge's columns of one row, only if one of them differs (so an unchanged
    /// row keeps its `updatedAt`), and only if the row is still the container it was (same
    /// id, node and `createdAt`). Returns the `updatedAt` written, or None when nothing was.
    pub async fn write_back(
        &self,
        row: &ContainerRow,
        state: &RowState,
        now: Timestamp,
    ) -> Result<Option<String>, WriteBackError> {
        let e = self.engine();
        let created = match e {
            Engine::Postgres => format!(r#""createdAt" = {}"#, e.ts_param(6)),
            Engine::Sqlite => format!(r#"CAST("createdAt" AS TEXT) = {}"#, e.ts_param(6)),
        };
        let sql = format!(
            r#"UPDATE "Containers"
               SET "containerId" = $1, "ipv4Address" = $2, "macAddress" = NULL, "updatedAt" = {}
               WHERE id = $4 AND "nodeId" = $5 AND {created}
                 AND ("containerId" IS DISTINCT FROM $1 OR "ipv4Address" IS DISTINCT FROM $2
                      OR "macAddress" IS NOT NULL)"#,
            e.ts_param(3)
        );
        let updated_at = e.format(now);
        let result = on_pool!(self, pool => sqlx::query(&sql)
            .bind(&state.container_id)
            .bind(&state.ipv4_address)
            .bind(&updated_at)
            .bind(row.id)
            .bind(row.node_id)
            .bind(&row.created_at)
            .execute(pool)
            .await
            .map(|r| r.rows_affected()));
        match result {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(updated_at)),
            Err(sqlx::Error::Database(err)) if err.kind() == ErrorKind::UniqueViolation => {
                Err(WriteBackError::Row(RowError::UniqueWriteBack {
                    constraint: err.constraint().unwrap_or("a unique index").to_string(),
                }))
            }
            Err(source) => {
                Err(WriteBackError::Bridge(BridgeError::Database { operation: "writing back to Containers", source }))
            }
        }
    }
}

/// A write-back fails for the row (retried on a later pass) or for the database.
#[derive(Debug)]
pub enum WriteBackError {
    Row(RowError),
    Bridge(BridgeError),
}

/// `scheme://user:password@host` or `?password=`: a password in the URL would end up in
/// process listings, shell history and logs.
fn url_has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else { return false };
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let in_userinfo = authority.rsplit_once('@').is_some_and(|(userinfo, _)| userinfo.contains(':'));
    let in_query = rest.split_once('?').is_some_and(|(_, query)| {
        query.split('&').any(|pair| pair.split('=').next().is_some_and(|k| k.eq_ignore_ascii_case("password")))
    });
    in_userinfo || in_query
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_refused() {
        assert!(url_has_password("postgres://mw:secret@db:5432/manager"));
        assert!(url_has_password("postgres://mw@db/manager?sslmode=require&password=secret"));
        assert!(!url_has_password("postgres://mw@db:5432/manager?sslmode=verify-full"));
        assert!(!url_has_password("postgres://db/manager"));
        assert!(!url_has_password("sqlite:///var/lib/manager/database.sqlite"));
        let err = Database::connect(&Target { url: "postgres://u:p@h/d".into(), password: None }).unwrap_err();
        assert!(err.to_string().contains("--database-password-file"), "{err}");
        assert!(!err.to_string().contains(":p@"), "{err}");
    }

    #[test]
    fn timestamps_in_each_engines_form() {
        let t = parse_timestamp("2026-07-21 09:12:40.208 +00:00").unwrap();
        assert_eq!(Engine::Sqlite.format(t), "2026-07-21 09:12:40.208 +00:00");
        assert_eq!(Engine::Postgres.format(t), "2026-07-21 09:12:40.208000 +00:00");
        let pg = parse_timestamp("2026-07-21 09:12:40.208123 +00:00").unwrap();
        assert_eq!(Engine::Sqlite.format(pg), "2026-07-21 09:12:40.208 +00:00", "truncated, never rounded up");
        assert_eq!(parse_timestamp("2026-07-21 11:12:40.208 +02:00"), Some(t));
        assert_eq!(parse_timestamp("yesterday"), None);
    }

    #[test]
    fn debug_never_shows_the_password() {
        let t = Target { url: "postgres://mw@h/d".into(), password: Some("hunter2".into()) };
        assert!(!format!("{t:?}").contains("hunter2"));
    }
}
