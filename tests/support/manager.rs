//! Manager's database for the bridge tests: a real SQLite file or a real PostgreSQL
//! database (on the server `make test` starts with hack/postgres.sh), each built from the
//! schema Manager's own migrations leave (tests/fixtures/manager-schema/) and its sample rows.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::jiff::Timestamp;
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

const FIXTURES: &str = "tests/fixtures/manager-schema";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

/// Cloned, a handle to the same pool (a test may read the database from a task of its own).
#[derive(Clone)]
enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// One test's own Manager database.
#[derive(Clone)]
pub struct ManagerDb {
    pub engine: Engine,
    /// What the bridge is given (`--database-url`): never a password.
    pub url: String,
    /// `--database-password-file`, for PostgreSQL.
    pub password_file: Option<String>,
    pool: Pool,
}

macro_rules! on_pool {
    ($db:expr, $pool:ident => $body:expr) => {
        match &$db.pool {
            Pool::Sqlite($pool) => $body,
            Pool::Postgres($pool) => $body,
        }
    };
}

fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    format!("{prefix}_{}_{}_{}", std::process::id(), nanos % 1_000_000_000, N.fetch_add(1, Ordering::Relaxed))
}

fn fixture(name: &str) -> String {
    let path = format!("{FIXTURES}/{name}");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// Where `make test`'s PostgreSQL is: URL of its admin database, password file, CA.
pub struct PgServer {
    pub url: String,
    pub password_file: String,
    pub ca: String,
}

impl PgServer {
    /// The server `make test` started (hack/postgres.sh up test).
    pub fn shared() -> PgServer {
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!("{name} is not set: the bridge tests need the PostgreSQL server `make test` starts (hack/postgres.sh)")
            })
        };
        PgServer {
            url: var("MW_TEST_PG_URL"),
            password_file: var("MW_TEST_PG_PASSWORD_FILE"),
            ca: var("MW_TEST_PG_CA"),
        }
    }

    fn password(&self) -> String {
        std::fs::read_to_string(&self.password_file).expect("reading the PostgreSQL password").trim().to_string()
    }

    fn url_for(&self, database: &str) -> String {
        let base = self.url.rsplit_once('/').map(|(b, _)| b).unwrap_or(&self.url);
        format!("{base}/{database}?sslmode=verify-full&sslrootcert={}", self.ca)
    }

    async fn connect(&self, database: &str) -> PgPool {
        let options = PgConnectOptions::from_str(&self.url_for(database))
            .expect("a valid PostgreSQL URL")
            .password(&self.password())
            .disable_statement_logging();
        PgPoolOptions::new().max_connections(2).connect_with(options).await.expect("connecting to the test PostgreSQL")
    }
}

/// The sample rows' `containerId`s name namespace `default`, where an earlier install ran
/// them; each test maps their node to a namespace of its own, where the bridge would hold
/// them as `node_moved` (docs/bridge.md). Cleared, so they are new containers to the bridge;
/// `SAMPLE_PROVIDER_IDS` puts them back.
const FRESH_PROVIDER_IDS: &str = r#"UPDATE "Containers" SET "containerId" = NULL"#;

/// The sample rows' provider ids, as `sample-rows.sql` writes them.
pub const SAMPLE_PROVIDER_IDS: &str = r#"UPDATE "Containers" SET "containerId" = 'default/' || hostname
    WHERE hostname IN ('team-wiki', 'pg-analytics')"#;

impl ManagerDb {
    /// A new database with Manager's schema and sample rows, on `engine`.
    pub async fn new(engine: Engine) -> ManagerDb {
        match engine {
            Engine::Sqlite => Self::sqlite().await,
            Engine::Postgres => Self::postgres(&PgServer::shared()).await,
        }
    }

    async fn sqlite() -> ManagerDb {
        let dir = PathBuf::from(std::env::var("MW_TEST_SQLITE_DIR").unwrap_or_else(|_| "target/bridge-tests".into()));
        std::fs::create_dir_all(&dir).expect("creating the SQLite test directory");
        let path = std::fs::canonicalize(&dir).expect("test directory").join(format!("{}.sqlite", unique("manager")));
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(std::time::Duration::from_secs(30))
            .disable_statement_logging();
        let pool =
            SqlitePoolOptions::new().max_connections(1).connect_with(options).await.expect("creating SQLite file");
        // sqlite_sequence is SQLite's own table: it appears with the first AUTOINCREMENT table
        // and cannot be created by hand (see the fixtures' README).
        let schema: String = fixture("sqlite.sql")
            .lines()
            .filter(|l| l.trim() != "CREATE TABLE sqlite_sequence(name,seq);")
            .collect::<Vec<_>>()
            .join("\n");
        sqlx::raw_sql(&schema).execute(&pool).await.expect("loading Manager's SQLite schema");
        sqlx::raw_sql(&fixture("sample-rows.sql")).execute(&pool).await.expect("loading the sample rows");
        sqlx::raw_sql(FRESH_PROVIDER_IDS).execute(&pool).await.expect("clearing the sample rows' provider ids");
        ManagerDb {
            engine: Engine::Sqlite,
            url: format!("sqlite://{}", path.display()),
            password_file: None,
            pool: Pool::Sqlite(pool),
        }
    }

    /// A new database on `server`.
    pub async fn postgres(server: &PgServer) -> ManagerDb {
        let name = unique("manager");
        let admin = server.connect("postgres").await;
        sqlx::raw_sql(&format!("CREATE DATABASE {name}")).execute(&admin).await.expect("creating a test database");
        admin.close().await;
        let pool = server.connect(&name).await;
        sqlx::raw_sql(&fixture("postgres.sql")).execute(&pool).await.expect("loading Manager's PostgreSQL schema");
        sqlx::raw_sql(&fixture("sample-rows.sql")).execute(&pool).await.expect("loading the sample rows");
        sqlx::raw_sql(FRESH_PROVIDER_IDS).execute(&pool).await.expect("clearing the sample rows' provider ids");
        ManagerDb {
            engine: Engine::Postgres,
            url: server.url_for(&name),
            password_file: Some(server.password_file.clone()),
            pool: Pool::Postgres(pool),
        }
    }

    /// Run statements (no results).
    pub async fn exec(&self, sql: &str) {
        on_pool!(self, pool => sqlx::raw_sql(sql).execute(pool).await.map(|_| ()))
            .unwrap_or_else(|e| panic!("running {sql}: {e}"));
    }

    /// Like `exec`, returning the error.
    pub async fn try_exec(&self, sql: &str) -> Result<(), sqlx::Error> {
        on_pool!(self, pool => sqlx::raw_sql(sql).execute(pool).await.map(|_| ()))
    }

    /// One text column of every row of a query.
    pub async fn texts(&self, sql: &str) -> Vec<Option<String>> {
        on_pool!(self, pool => sqlx::query_scalar::<_, Option<String>>(sql).fetch_all(pool).await)
            .unwrap_or_else(|e| panic!("running {sql}: {e}"))
    }

    /// `containerId`, `ipv4Address`, `macAddress` of the container with this hostname.
    pub async fn written(&self, hostname: &str) -> Option<(Option<String>, Option<String>, Option<String>)> {
        let sql = format!(
            r#"SELECT "containerId", "ipv4Address", "macAddress" FROM "Containers" WHERE hostname = '{hostname}'"#
        );
        on_pool!(self, pool => sqlx::query_as(&sql).fetch_optional(pool).await)
            .unwrap_or_else(|e| panic!("running {sql}: {e}"))
    }

    /// `Containers.id` of the container with this hostname.
    pub async fn id_of(&self, hostname: &str) -> i64 {
        let sql = format!(r#"SELECT CAST(id AS BIGINT) FROM "Containers" WHERE hostname = '{hostname}'"#);
        on_pool!(self, pool => sqlx::query_scalar::<_, i64>(&sql).fetch_one(pool).await)
            .unwrap_or_else(|e| panic!("running {sql}: {e}"))
    }

    /// Count of rows a query returns (a `SELECT COUNT(*)`).
    pub async fn count(&self, sql: &str) -> i64 {
        on_pool!(self, pool => sqlx::query_scalar::<_, i64>(sql).fetch_one(pool).await)
            .unwrap_or_else(|e| panic!("running {sql}: {e}"))
    }

    /// Insert a container on node `node` (by name) of site bridge-lab, as Manager's API does.
    pub async fn insert_container(&self, node: &str, hostname: &str, template: Option<&str>, env: Option<&str>) {
        self.exec(&insert_container_sql(node, hostname, template, env)).await;
    }

    /// Add another Manager node of type kubernetes in site bridge-lab.
    pub async fn insert_node(&self, name: &str) {
        let now = now();
        self.exec(&format!(
            r#"INSERT INTO "Nodes" ("name", "nodeType", "siteId", "imageStorage", "volumeStorage", "networkBridge",
                 "nvidiaAvailable", "createdAt", "updatedAt")
               VALUES ('{name}', 'kubernetes', (SELECT "id" FROM "Sites" WHERE "name" = 'bridge-lab'),
                 'local', 'local-lvm', 'vmbr0', false, '{now}', '{now}')"#
        ))
        .await;
    }

    /// Set `Settings.default_container_env_vars` as Manager's migration seeds it.
    pub async fn set_default_env(&self, json: &str) {
        let now = now();
        let json = json.replace('\'', "''");
        self.exec(&format!(
            r#"DELETE FROM "Settings" WHERE key = 'default_container_env_vars';
               INSERT INTO "Settings" (key, value, "createdAt", "updatedAt")
               VALUES ('default_container_env_vars', '{json}', '{now}', '{now}')"#
        ))
        .await;
    }

    pub async fn close(&self) {
        on_pool!(self, pool => pool.close().await)
    }
}

/// Now, as Sequelize writes timestamps (both engines parse it).
pub fn now() -> String {
    format!("{} +00:00", Timestamp::now().strftime("%Y-%m-%d %H:%M:%S%.3f"))
}

/// A PostgreSQL server of one test's own (hack/postgres.sh), for outages that must not hit
/// the other tests' databases. Removed when dropped.
pub struct OwnPgServer {
    pub name: String,
    pub server: PgServer,
}

fn postgres_sh(args: &[&str]) -> String {
    let out = std::process::Command::new("bash")
        .arg("hack/postgres.sh")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running hack/postgres.sh {args:?}: {e}"));
    assert!(out.status.success(), "hack/postgres.sh {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl OwnPgServer {
    pub fn start(test: &str) -> OwnPgServer {
        let name = format!("{test}-{}", std::process::id());
        postgres_sh(&["up", &name]);
        let server = PgServer {
            url: postgres_sh(&["url", &name]),
            password_file: postgres_sh(&["password-file", &name]),
            ca: postgres_sh(&["ca", &name]),
        };
        OwnPgServer { name, server }
    }

    /// Stop the server, keeping its data and port.
    pub fn pause(&self) {
        postgres_sh(&["pause", &self.name]);
    }

    pub fn resume(&self) {
        postgres_sh(&["resume", &self.name]);
    }
}

impl Drop for OwnPgServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash").args(["hack/postgres.sh", "down", &self.name]).output();
    }
}

impl ManagerDb {
    /// Hold SQLite's write lock for `hold` (Manager's own writers, a backup or a migration do
    /// this), running `sql` inside the locked transaction; it commits at the end. `locked` is
    /// told once the lock is held.
    pub async fn lock_sqlite_for(
        &self,
        hold: std::time::Duration,
        sql: &str,
        locked: tokio::sync::oneshot::Sender<()>,
    ) {
        let Pool::Sqlite(pool) = &self.pool else { panic!("lock_sqlite_for is for SQLite") };
        let mut conn = pool.acquire().await.expect("a SQLite connection");
        sqlx::raw_sql("BEGIN EXCLUSIVE").execute(&mut *conn).await.expect("taking the write lock");
        let _ = locked.send(());
        sqlx::raw_sql(sql).execute(&mut *conn).await.unwrap_or_else(|e| panic!("running {sql}: {e}"));
        tokio::time::sleep(hold).await;
        sqlx::raw_sql("COMMIT").execute(&mut *conn).await.expect("releasing the write lock");
    }
}

/// The INSERT of `ManagerDb::insert_container`, as SQL (for use inside a transaction).
pub fn insert_container_sql(node: &str, hostname: &str, template: Option<&str>, env: Option<&str>) -> String {
    let lit = |v: Option<&str>| v.map_or("NULL".to_string(), |s| format!("'{}'", s.replace('\'', "''")));
    let now = now();
    format!(
        r#"INSERT INTO "Containers" ("hostname", "username", "nodeId", "siteId", "aiContainer", "template",
             "environmentVars", "nvidiaRequested", "createdAt", "updatedAt")
           VALUES ('{hostname}', 'tester', (SELECT "id" FROM "Nodes" WHERE "name" = '{node}'),
             (SELECT "id" FROM "Sites" WHERE "name" = 'bridge-lab'), 'N', {}, {}, false, '{now}', '{now}')"#,
        lit(template),
        lit(env),
    )
}
