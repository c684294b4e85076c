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
use super::rows::{ContainerRow, Fingerprint, GrantRow, NodeRow, RowState, ServiceRow};
use crate::election::Leadership;

/// A connection pool to Manager's database, and the leadership its one write (the
/// write-back) is fenced by.
#[derive(Clone, Debug)]
pub struct Database {
    pool: Pool,
    leadership: Leadership,
}

#[derive(Clone, Debug)]
enum Pool {
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
        match &$db.pool {
            Pool::Postgres($pool) => $body,
            Pool::Sqlite($pool) => $body,
        }
    };
}

impl Engine {
    /// A timestamp column or expression as UTC text in Sequelize's form. PostgreSQL keeps
    /// microseconds (so the text compares back exactly); SQLite holds the text Manager wrote.
    fn ts(self, expr: &str) -> String {
        match self {
            Engine::Postgres => {
                format!("to_char(({expr}) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') || ' +00:00'")
            }
            Engine::Sqlite => format!("CAST({expr} AS TEXT)"),
        }
    }

    /// The database's clock, now, as `ts` renders it. Stamps and poll bounds come from here,
    /// never the bridge's clock, which may differ from the one stamping Manager's rows (see
    /// `sync::manager_stamp`).
    fn now(self) -> String {
        match self {
            Engine::Postgres => self.ts("now()"),
            // Sequelize's form: milliseconds (%f is SS.SSS) and an explicit offset.
            Engine::Sqlite => "(strftime('%Y-%m-%d %H:%M:%f', 'now') || ' +00:00')".to_string(),
        }
    }

    /// Parameter `n` where a timestamp is expected.
    fn ts_param(self, n: u8) -> String {
        match self {
            Engine::Postgres => format!("CAST(${n} AS timestamptz)"),
            Engine::Sqlite => format!("${n}"),
        }
    }

    /// A moment as this engine's timestamps compare. SQLite compares the text Sequelize writes
    /// (milliseconds, explicit offset), so ours must match.
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
    /// A lazily connecting pool: a database down at start-up is retried by the sync loop like
    /// one that goes down later. Only a malformed URL fails here.
    pub fn connect(target: &Target) -> Result<Database, BridgeError> {
        let url = target.url.trim();
        if let Some(why) = url_password(url) {
            return Err(BridgeError::Config(format!(
                "the database URL holds a password ({why}); give it with --database-password-file or MW_DATABASE_PASSWORD instead"
            )));
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
            if let Some(why) = weak_tls(options.get_ssl_mode()) {
                tracing::warn!(sslmode = ?options.get_ssl_mode(), "{why}; use sslmode=verify-full in production");
            }
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .acquire_timeout(Duration::from_secs(10))
                .connect_lazy_with(options);
            Ok(Database { pool: Pool::Postgres(pool), leadership: Leadership::unfenced() })
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
            Ok(Database { pool: Pool::Sqlite(pool), leadership: Leadership::unfenced() })
        } else {
            Err(BridgeError::Config("the database URL must start with postgres://, postgresql:// or sqlite:".into()))
        }
    }

    /// The same pool, its write-back fenced by `leadership` (a replica that no longer leads
    /// writes nothing to Manager either).
    pub fn fenced(self, leadership: Leadership) -> Database {
        Database { leadership, ..self }
    }

    pub fn engine(&self) -> Engine {
        match self.pool {
            Pool::Postgres(_) => Engine::Postgres,
            Pool::Sqlite(_) => Engine::Sqlite,
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

    /// The http and transport `"Services"` of these containers with their transport protocol,
    /// in id order. (`dns` services are SRV records, with no port of the container's to route.)
    pub async fn services(&self, containers: &[i64]) -> Result<Vec<ServiceRow>, BridgeError> {
        let mut out = Vec::new();
        // In chunks, to stay well within both engines' limits on a statement.
        for chunk in containers.chunks(1000) {
            let sql = format!(
                r#"SELECT CAST(s."containerId" AS BIGINT) AS container_id, CAST(s.type AS TEXT) AS kind,
                     CAST(s."internalPort" AS BIGINT) AS internal_port, CAST(t.protocol AS TEXT) AS protocol
                   FROM "Services" s LEFT JOIN "TransportServices" t ON t."serviceId" = s.id
                   WHERE s."containerId" IN ({}) AND CAST(s.type AS TEXT) IN ('http', 'transport')
                   ORDER BY s.id"#,
                id_list(chunk)
            );
            let rows: Vec<ServiceRow> = on_pool!(self, pool => sqlx::query_as(&sql).fetch_all(pool).await)
                .map_err(BridgeError::db("reading Services"))?;
            out.extend(rows);
        }
        Ok(out)
    }

    /// Containers with their http and transport services attached.
    pub async fn containers_with_services(
        &self,
        nodes: &[i64],
        since: Option<Timestamp>,
    ) -> Result<Vec<ContainerRow>, BridgeError> {
        let mut rows = self.containers(nodes, since).await?;
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let mut by_container: std::collections::HashMap<i64, Vec<ServiceRow>> = Default::default();
        for service in self.services(&ids).await? {
            by_container.entry(service.container_id).or_default().push(service);
        }
        for row in &mut rows {
            row.services = by_container.remove(&row.id).unwrap_or_default();
        }
        Ok(rows)
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
                 (SELECT {} || '/' || CAST(COUNT(*) AS TEXT) FROM "ResourceRequests") AS grants_updated,
                 (SELECT COALESCE({}, '') || '/' || CAST(COUNT(*) AS TEXT) || '/' || CAST(COALESCE(SUM(id), 0) AS TEXT)
                    FROM "Services") || ':' ||
                 (SELECT COALESCE({}, '') || '/' || CAST(COUNT(*) AS TEXT) FROM "TransportServices") AS services_updated,
                 {} AS db_now"#,
            e.ts(r#"MAX("updatedAt")"#),
            e.ts(r#"MAX("updatedAt")"#),
            e.ts(r#"MAX("updatedAt")"#),
            e.ts(r#"MAX("updatedAt")"#),
            e.ts(r#"MAX("updatedAt")"#),
            e.now(),
        );
        on_pool!(self, pool => sqlx::query_as(&sql).fetch_one(pool).await).map_err(BridgeError::db("polling"))
    }

    /// Write the bridge's columns of one row, only if one differs (so an unchanged row keeps its
    /// `updatedAt`) and the row is still the same container (id, node, `createdAt`). `updatedAt`
    /// is stamped by the database's clock. Returns the `updatedAt` written, if any.
    pub async fn write_back(&self, row: &ContainerRow, state: &RowState) -> Result<Option<String>, WriteBackError> {
        let e = self.engine();
        let created = match e {
            Engine::Postgres => format!(r#""createdAt" = {}"#, e.ts_param(5)),
            Engine::Sqlite => format!(r#"CAST("createdAt" AS TEXT) = {}"#, e.ts_param(5)),
        };
        let sql = format!(
            r#"UPDATE "Containers"
               SET "containerId" = $1, "ipv4Address" = $2, "macAddress" = NULL, "updatedAt" = {now}
               WHERE id = $3 AND "nodeId" = $4 AND {created}
                 AND ("containerId" IS DISTINCT FROM $1 OR "ipv4Address" IS DISTINCT FROM $2
                      OR "macAddress" IS NOT NULL)
               RETURNING {stamp}"#,
            now = match e {
                // A timestamptz column takes now() as it is.
                Engine::Postgres => "now()".to_string(),
                Engine::Sqlite => e.now(),
            },
            stamp = e.ts(r#""updatedAt""#),
        );
        let write = async {
            on_pool!(self, pool => sqlx::query_scalar::<_, String>(&sql)
                .bind(&state.container_id)
                .bind(&state.ipv4_address)
                .bind(row.id)
                .bind(row.node_id)
                .bind(&row.created_at)
                .fetch_optional(pool)
                .await)
        };
        let result = self
            .leadership
            .write(write)
            .await
            .map_err(|refused| WriteBackError::Bridge(BridgeError::NotLeading(refused)))?;
        match result {
            Ok(written) => Ok(written),
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

/// Why the URL holds a password, if it does: `scheme://user:password@host` or `?password=`,
/// also percent-escaped (which sqlx decodes). A password in the URL ends up in process
/// listings, shell history and logs.
fn url_password(url: &str) -> Option<&'static str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        if userinfo.contains(':') {
            return Some("user:password@ in the authority");
        }
        // sqlx percent-decodes the user name: `mw%3Asecret` is a user:password pair too.
        if percent_decode(userinfo).contains(':') {
            return Some("a percent-encoded ':' in the user name");
        }
    }
    let query = rest.split_once('?').map(|(_, q)| q.split('#').next().unwrap_or(q)).unwrap_or("");
    let has_password_key = query.split('&').any(|pair| {
        let key = pair.split('=').next().unwrap_or("");
        // Keys are decoded as application/x-www-form-urlencoded, as sqlx reads them.
        percent_decode(&key.replace('+', " ")).trim().eq_ignore_ascii_case("password")
    });
    has_password_key.then_some("a password= parameter")
}

/// Decode `%XX` escapes; anything else (a bad escape, invalid UTF-8) is kept as it is, lossily.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
                i += 3;
            }
            (b, ..) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Why an sslmode is weaker than verify-full, if it is: only verify-full checks both the CA
/// and the host name; anything less lets a machine in the path read the password and rows.
fn weak_tls(mode: PgSslMode) -> Option<&'static str> {
    match mode {
        PgSslMode::VerifyFull => None,
        PgSslMode::VerifyCa => Some("sslmode=verify-ca checks the server's CA but not its host name"),
        PgSslMode::Require => Some("sslmode=require encrypts but does not check the server's certificate"),
        PgSslMode::Disable | PgSslMode::Allow | PgSslMode::Prefer => {
            Some("the database connection is not required to use TLS")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_urls_are_refused() {
        let has = |url: &str| url_password(url).is_some();
        assert!(has("postgres://mw:secret@db:5432/manager"));
        assert!(has("postgres://mw@db/manager?sslmode=require&password=secret"));
        assert!(!has("postgres://mw@db:5432/manager?sslmode=verify-full"));
        assert!(!has("postgres://db/manager"));
        assert!(!has("sqlite:///var/lib/manager/database.sqlite"));
        let err = Database::connect(&Target { url: "postgres://u:p@h/d".into(), password: None }).unwrap_err();
        assert!(err.to_string().contains("--database-password-file"), "{err}");
        assert!(!err.to_string().contains(":p@"), "{err}");
    }

    #[test]
    fn percent_encoded_passwords_in_urls_are_refused() {
        // sqlx decodes these before use: each one sets a password.
        for url in [
            "postgres://mw@db/manager?pass%77ord=secret",
            "postgres://mw@db/manager?%70%61%73%73%77%6F%72%64=secret",
            "postgres://mw@db/manager?sslmode=verify-full&PASSWORD=secret",
            "postgres://mw%3Asecret@db/manager",
            "postgres://mw%3asecret@db/manager",
            "postgres://mw:p%40ss@db/manager",
        ] {
            assert!(url_password(url).is_some(), "{url} holds a password");
            let err = Database::connect(&Target { url: url.into(), password: None }).unwrap_err();
            assert!(!err.to_string().contains("secret"), "{err}");
        }
        // Escapes that decode to nothing of the kind are fine.
        assert_eq!(url_password("postgres://mw%40corp@db/manager?application_name=a%3Ab"), None);
        assert_eq!(url_password("postgres://mw@db/manager?passwordless=1"), None);
        assert_eq!(percent_decode("a%3Ab%zz%4"), "a:b%zz%4");
        assert_eq!(percent_decode("%E2%9C%93"), "\u{2713}");
    }

    #[test]
    fn tls_weaker_than_verify_full_is_warned_about() {
        assert_eq!(weak_tls(PgSslMode::VerifyFull), None);
        for mode in [PgSslMode::VerifyCa, PgSslMode::Require, PgSslMode::Prefer, PgSslMode::Allow, PgSslMode::Disable] {
            assert!(weak_tls(mode).is_some(), "{mode:?}");
        }
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
