//! The workspace's harness for test binaries whose tests need a server: Redis, a Redis Cluster,
//! Postgres (a running server, or the binaries to start one), or a browser; and
//! [`FaultyStore`], a store over any other that fails, hangs or answers slowly on command.
//!
//! libtest decides whether a test is ignored when it is compiled, so a test that finds its
//! server missing could only pass or fail. These binaries (`harness = false`) list their tests
//! with [`Tests`] instead: each service a test needs is probed once at start-up, and when it is
//! missing its tests are reported by the runner as **ignored, with the reason**, or **fail**
//! when the service is required (`BACKSTOP_REQUIRE_REDIS=1`, `BACKSTOP_REQUIRE_REDIS_CLUSTER=1`,
//! `BACKSTOP_REQUIRE_POSTGRES=1`, `BACKSTOP_REQUIRE_BROWSER=1`: what CI sets). Tests that need
//! no service run as always. The command line is libtest's (filters, `--exact`, `--skip`,
//! `--list`, `--ignored`, `--test-threads`…), through `libtest-mimic`; unlike libtest it does not
//! capture what a test prints.
//!
//! ```no_run
//! use backstop_test_support::{Service, Tests};
//!
//! async fn memory_round_trip() {}
//! async fn redis_round_trip() {
//!     let url = backstop_test_support::redis_url();
//!     // connect to `url`: the harness probed it, so a failure here is a real one.
//! }
//!
//! fn main() {
//!     let mut tests = Tests::new();
//!     tests.current("memory_round_trip", memory_round_trip);
//!     tests.needs(Service::Redis).current("redis_round_trip", redis_round_trip);
//!     tests.run();
//! }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

mod faulty;

pub use faulty::{Fault, FaultyStore, KeepsNoNotes, Op};

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use libtest_mimic::{Arguments, Completion, Failed, Trial};

mod servers;

pub use servers::{PgBouncer, PgCluster, RedisSentinelSet, RedisServer};

/// How long a probe waits for a server before it counts as missing.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Something a test needs from the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Service {
    /// A Redis server at [`redis_url`]; required with `BACKSTOP_REQUIRE_REDIS=1`.
    Redis,
    /// A Redis Cluster at [`redis_cluster_urls`]; required with
    /// `BACKSTOP_REQUIRE_REDIS_CLUSTER=1`.
    RedisCluster,
    /// A Postgres server at [`postgres_url`]; required with `BACKSTOP_REQUIRE_POSTGRES=1`.
    Postgres,
    /// The `redis-server` binary on `PATH`, for tests that start and stop a server of their own;
    /// required with `BACKSTOP_REQUIRE_REDIS=1`.
    RedisServerBinary,
    /// Postgres's `initdb` and `pg_ctl` ([`pg_bin_dir`]), for tests that start and stop a
    /// cluster of their own; required with `BACKSTOP_REQUIRE_POSTGRES=1`.
    PostgresBinaries,
    /// `chromedriver` on `PATH` and Chromium at `/usr/bin/chromium`; required with
    /// `BACKSTOP_REQUIRE_BROWSER=1`.
    Browser,
    /// A PgBouncer in transaction pooling mode at [`pgbouncer_url`], in front of a Postgres;
    /// required with `BACKSTOP_REQUIRE_PGBOUNCER=1`.
    PgBouncer,
    /// The `pgbouncer` binary on `PATH` and Postgres's binaries ([`pg_bin_dir`]), for tests
    /// that start a Postgres and a PgBouncer of their own; required with
    /// `BACKSTOP_REQUIRE_PGBOUNCER=1`.
    PgBouncerBinaries,
    /// `redis-server` and `redis-sentinel` on `PATH`, for tests that start a primary, a replica
    /// and a Sentinel of their own; required with `BACKSTOP_REQUIRE_REDIS_SENTINEL=1`.
    RedisSentinelBinaries,
    /// Redis Sentinels at [`redis_sentinel_urls`] watching a primary named
    /// [`redis_sentinel_master`]; required with `BACKSTOP_REQUIRE_REDIS_SENTINEL=1`.
    RedisSentinel,
}

impl Service {
    /// The variable that makes a missing service a failure.
    fn required_by(self) -> &'static str {
        match self {
            Service::Redis | Service::RedisServerBinary => "BACKSTOP_REQUIRE_REDIS",
            Service::RedisCluster => "BACKSTOP_REQUIRE_REDIS_CLUSTER",
            Service::Postgres | Service::PostgresBinaries => "BACKSTOP_REQUIRE_POSTGRES",
            Service::Browser => "BACKSTOP_REQUIRE_BROWSER",
            Service::PgBouncer | Service::PgBouncerBinaries => "BACKSTOP_REQUIRE_PGBOUNCER",
            Service::RedisSentinel | Service::RedisSentinelBinaries => {
                "BACKSTOP_REQUIRE_REDIS_SENTINEL"
            }
        }
    }

    /// Whether the service is required (its variable is `1`).
    fn required(self) -> bool {
        std::env::var(self.required_by()).is_ok_and(|v| v == "1")
    }

    /// What is missing, in a few words, and how to provide it.
    fn hint(self) -> &'static str {
        match self {
            Service::Redis => "start redis-server or set BACKSTOP_REDIS_URL",
            Service::RedisCluster => {
                "start one with scripts/redis-cluster.sh or set BACKSTOP_REDIS_CLUSTER_URLS"
            }
            Service::Postgres => "start a server or set BACKSTOP_POSTGRES_URL",
            Service::RedisServerBinary => "apt-get install redis-server",
            Service::PostgresBinaries => "apt-get install postgresql, or set BACKSTOP_PG_BIN",
            Service::Browser => "apt-get install chromium chromium-driver",
            Service::PgBouncer => {
                "start pgbouncer (pool_mode = transaction) or set BACKSTOP_PGBOUNCER_URL"
            }
            Service::PgBouncerBinaries => "apt-get install pgbouncer postgresql",
            Service::RedisSentinelBinaries => "apt-get install redis-server redis-sentinel",
            Service::RedisSentinel => {
                "start redis-sentinel or set BACKSTOP_REDIS_SENTINEL_URLS and \
                 BACKSTOP_REDIS_SENTINEL_MASTER"
            }
        }
    }

    /// `Ok` when the service is there, else what the probe found.
    fn probe(self) -> Result<(), String> {
        match self {
            Service::Redis => probe_redis(&redis_url()),
            Service::RedisCluster => probe_redis_cluster(&redis_cluster_urls()),
            Service::Postgres => probe_postgres(&postgres_url()),
            Service::RedisServerBinary => runs("redis-server", &["--version"]),
            Service::PostgresBinaries => {
                pg_bin_dir().map(drop).ok_or_else(|| "no initdb".to_owned())
            }
            Service::Browser => runs("chromedriver", &["--version"]).and_then(|()| {
                std::path::Path::new("/usr/bin/chromium")
                    .exists()
                    .then_some(())
                    .ok_or_else(|| "no /usr/bin/chromium".to_owned())
            }),
            Service::PgBouncer => probe_pgbouncer(&pgbouncer_url()),
            Service::PgBouncerBinaries => runs("pgbouncer", &["--version"])
                .and_then(|()| pg_bin_dir().map(drop).ok_or_else(|| "no initdb".to_owned())),
            Service::RedisSentinelBinaries => runs("redis-server", &["--version"])
                .and_then(|()| runs("redis-sentinel", &["--version"])),
            Service::RedisSentinel => probe_redis_sentinel(&redis_sentinel_urls()),
        }
    }

    /// What the probe looked for: `no redis at redis://127.0.0.1:6379`.
    fn what(self) -> String {
        match self {
            Service::Redis => format!("no redis at {}", redis_url()),
            Service::RedisCluster => {
                format!("no redis cluster at {}", redis_cluster_urls().join(","))
            }
            Service::Postgres => format!("no postgres at {}", postgres_url()),
            Service::RedisServerBinary => "no redis-server binary".to_owned(),
            Service::PostgresBinaries => "no postgres binaries".to_owned(),
            Service::Browser => "no browser".to_owned(),
            Service::PgBouncer => format!("no pgbouncer at {}", pgbouncer_url()),
            Service::PgBouncerBinaries => "no pgbouncer or postgres binaries".to_owned(),
            Service::RedisSentinelBinaries => "no redis-server or redis-sentinel".to_owned(),
            Service::RedisSentinel => format!(
                "no redis sentinel at {} for {}",
                redis_sentinel_urls().join(","),
                redis_sentinel_master()
            ),
        }
    }
}

/// The Redis server the tests use: `BACKSTOP_REDIS_URL`, by default `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("BACKSTOP_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// The Redis Cluster the tests use: `BACKSTOP_REDIS_CLUSTER_URLS` (comma-separated), by default
/// `redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002` (what
/// `scripts/redis-cluster.sh` starts).
pub fn redis_cluster_urls() -> Vec<String> {
    std::env::var("BACKSTOP_REDIS_CLUSTER_URLS")
        .unwrap_or_else(|_| {
            "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002".to_owned()
        })
        .split(',')
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .collect()
}

/// The Postgres server the tests use: `BACKSTOP_POSTGRES_URL`, by default
/// `postgres://postgres@127.0.0.1:5432/postgres`.
pub fn postgres_url() -> String {
    std::env::var("BACKSTOP_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The PgBouncer (transaction pooling) the tests use: `BACKSTOP_PGBOUNCER_URL`, by default
/// `postgres://postgres@127.0.0.1:6432/postgres` (PgBouncer's default port).
pub fn pgbouncer_url() -> String {
    std::env::var("BACKSTOP_PGBOUNCER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:6432/postgres".to_owned())
}

/// The Redis Sentinels the tests use: `BACKSTOP_REDIS_SENTINEL_URLS` (comma-separated), by
/// default `redis://127.0.0.1:26379` (Sentinel's default port).
pub fn redis_sentinel_urls() -> Vec<String> {
    std::env::var("BACKSTOP_REDIS_SENTINEL_URLS")
        .unwrap_or_else(|_| "redis://127.0.0.1:26379".to_owned())
        .split(',')
        .map(|u| u.trim().to_owned())
        .filter(|u| !u.is_empty())
        .collect()
}

/// The name of the primary the Sentinels watch: `BACKSTOP_REDIS_SENTINEL_MASTER`, by default
/// `mymaster` (the name in Debian's `sentinel.conf`).
pub fn redis_sentinel_master() -> String {
    std::env::var("BACKSTOP_REDIS_SENTINEL_MASTER").unwrap_or_else(|_| "mymaster".to_owned())
}

/// Where Postgres's `initdb` is: `BACKSTOP_PG_BIN`, else on `PATH`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout); `None` when there is none.
pub fn pg_bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("BACKSTOP_PG_BIN") {
        let dir = PathBuf::from(dir);
        return dir.join("initdb").is_file().then_some(dir);
    }
    let on_path = std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).find(|p| p.join("initdb").is_file()));
    on_path.or_else(|| {
        let mut dirs: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").is_file())
            .collect();
        dirs.sort_by_key(|p| {
            p.parent()
                .and_then(|v| v.file_name()?.to_str()?.parse::<u32>().ok())
        });
        dirs.pop()
    })
}

/// `Ok` when `program args` runs and succeeds.
fn runs(program: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{program} {}: {}", args.join(" "), out.status))
    }
}

/// Runs `probe` on a runtime of its own, within [`PROBE_TIMEOUT`].
fn probing<F, E>(probe: F) -> Result<(), String>
where
    F: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer in {PROBE_TIMEOUT:?}")),
        }
    })
}

fn probe_redis(url: &str) -> Result<(), String> {
    probing(async {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok::<_, redis::RedisError>(())
    })
}

fn probe_redis_cluster(urls: &[String]) -> Result<(), String> {
    probing(async {
        let client = redis::cluster::ClusterClient::new(urls.to_vec())?;
        let mut conn = client.get_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok::<_, redis::RedisError>(())
    })
}

fn probe_postgres(url: &str) -> Result<(), String> {
    use sqlx::Connection;
    probing(async {
        let conn = sqlx::PgConnection::connect(url).await?;
        conn.close().await
    })
}

/// PgBouncer refuses sqlx's startup parameter `extra_float_digits`: connect without it.
fn probe_pgbouncer(url: &str) -> Result<(), String> {
    use sqlx::Connection;
    use std::str::FromStr;
    probing(async {
        let options = sqlx::postgres::PgConnectOptions::from_str(url)?.extra_float_digits(None);
        let conn = sqlx::PgConnection::connect_with(&options).await?;
        conn.close().await
    })
}

/// One of the Sentinels answers for the primary, and the primary answers.
fn probe_redis_sentinel(urls: &[String]) -> Result<(), String> {
    let master = redis_sentinel_master();
    probing(async {
        let mut last = "no sentinel url".to_owned();
        for url in urls {
            let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
            let addr: Result<(String, u16), redis::RedisError> = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&master)
                    .query_async(&mut conn)
                    .await
            }
            .await;
            match addr {
                Ok((host, port)) => {
                    return probe_redis_async(&format!("redis://{host}:{port}"))
                        .await
                        .map_err(|e| e.to_string());
                }
                Err(e) => last = format!("{url}: {e}"),
            }
        }
        Err(last)
    })
}

async fn probe_redis_async(url: &str) -> Result<(), redis::RedisError> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    redis::cmd("PING").query_async::<String>(&mut conn).await?;
    Ok(())
}

/// How a test's `async fn` runs: tokio's runtimes as `#[tokio::test]` builds them.
#[derive(Clone, Copy, Debug)]
enum Runtime {
    /// `#[tokio::test]`: current thread.
    Current,
    /// `#[tokio::test(start_paused = true)]`: current thread, the clock paused.
    Paused,
    /// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`.
    MultiThread,
}

impl Runtime {
    fn block_on<F: Future<Output = ()>>(self, test: F) {
        let mut builder = match self {
            Runtime::Current | Runtime::Paused => tokio::runtime::Builder::new_current_thread(),
            Runtime::MultiThread => {
                let mut b = tokio::runtime::Builder::new_multi_thread();
                b.worker_threads(2);
                b
            }
        };
        builder.enable_all();
        if matches!(self, Runtime::Paused) {
            builder.start_paused(true);
        }
        builder
            .build()
            .expect("a tokio runtime for the test")
            .block_on(test);
    }
}

/// A service's state, probed once per test binary.
#[derive(Clone, Debug)]
enum State {
    There,
    /// Missing, and the tests that need it are ignored for this reason.
    Ignored(String),
    /// Missing but required: the tests that need it fail with this message.
    Failing(String),
}

/// The tests of one test binary, then [`run`](Tests::run).
pub struct Tests {
    trials: Vec<Trial>,
    services: HashMap<Service, State>,
    /// How many tests each missing service made ignored, for the summary line.
    ignored: Vec<(Service, usize)>,
}

impl std::fmt::Debug for Tests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tests")
            .field("tests", &self.trials.len())
            .field("services", &self.services)
            .finish()
    }
}

impl Default for Tests {
    fn default() -> Self {
        Tests::new()
    }
}

impl Tests {
    /// No tests yet.
    pub fn new() -> Self {
        Tests {
            trials: Vec::new(),
            services: HashMap::new(),
            ignored: Vec::new(),
        }
    }

    /// A plain test (`#[test]`).
    pub fn sync(&mut self, name: &str, test: impl FnOnce() + Send + 'static) -> &mut Self {
        self.trials.push(Trial::test(name, move || {
            test();
            Ok(())
        }));
        self
    }

    /// A test on a current-thread runtime (`#[tokio::test]`).
    pub fn current<F>(&mut self, name: &str, test: impl FnOnce() -> F + Send + 'static) -> &mut Self
    where
        F: Future<Output = ()>,
    {
        self.sync(name, move || Runtime::Current.block_on(test()))
    }

    /// A test on a current-thread runtime whose clock starts paused
    /// (`#[tokio::test(start_paused = true)]`).
    pub fn paused<F>(&mut self, name: &str, test: impl FnOnce() -> F + Send + 'static) -> &mut Self
    where
        F: Future<Output = ()>,
    {
        self.sync(name, move || Runtime::Paused.block_on(test()))
    }

    /// A test on a two-thread runtime
    /// (`#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`).
    pub fn multi_thread<F>(
        &mut self,
        name: &str,
        test: impl FnOnce() -> F + Send + 'static,
    ) -> &mut Self
    where
        F: Future<Output = ()>,
    {
        self.sync(name, move || Runtime::MultiThread.block_on(test()))
    }

    /// The role a test plays in a child process it starts (`Command::new(current_exe())` with
    /// `--exact name` and the environment variable `when` set): a plain test in that process
    /// only. Anywhere else it is not listed at all, so it is neither run nor reported as an
    /// ignored test.
    pub fn child_role(
        &mut self,
        name: &str,
        when: &str,
        test: impl FnOnce() + Send + 'static,
    ) -> &mut Self {
        if std::env::var_os(when).is_some() {
            self.sync(name, test);
        }
        self
    }

    /// A test that cannot run in this build, ignored with the reason (a store left out by a
    /// feature: `built without the redis feature`).
    pub fn unbuilt(&mut self, name: &str, reason: &str) -> &mut Self {
        let reason = reason.to_owned();
        self.trials.push(Trial::ignorable_test(name, move || {
            Ok(Completion::ignored_with(reason))
        }));
        self
    }

    /// The tests added through the returned value need `service`: they run when the probe
    /// finds it, are ignored with the reason when it is missing, and fail when it is missing
    /// and required.
    pub fn needs(&mut self, service: Service) -> Needing<'_> {
        Needing {
            tests: self,
            service,
        }
    }

    /// The state of `service`, probed the first time it is asked for.
    fn state(&mut self, service: Service) -> State {
        self.services
            .entry(service)
            .or_insert_with(|| match service.probe() {
                Ok(()) => State::There,
                Err(e) if service.required() => State::Failing(format!(
                    "{} ({e}), and it is required ({}=1): {}",
                    service.what(),
                    service.required_by(),
                    service.hint()
                )),
                Err(e) => State::Ignored(format!("{} ({e})", service.what())),
            })
            .clone()
    }

    /// Adds `test`, which needs `service`.
    fn gated(&mut self, service: Service, name: &str, test: Box<dyn FnOnce() + Send>) {
        let trial = match self.state(service) {
            State::There => Trial::test(name, move || {
                test();
                Ok(())
            }),
            State::Ignored(reason) => {
                match self.ignored.iter_mut().find(|(s, _)| *s == service) {
                    Some((_, n)) => *n += 1,
                    None => self.ignored.push((service, 1)),
                }
                Trial::ignorable_test(name, move || Ok(Completion::ignored_with(reason)))
            }
            State::Failing(message) => Trial::test(name, move || Err(Failed::from(message))),
        };
        self.trials.push(trial);
    }

    /// Runs the tests the command line selects, prints one line per missing service (what it
    /// made ignored and how to provide it), and exits with libtest's status.
    pub fn run(self) -> ! {
        let args = Arguments::from_args();
        if !args.list {
            for (service, n) in &self.ignored {
                let State::Ignored(reason) = &self.services[service] else {
                    continue;
                };
                eprintln!(
                    "note: {n} test{} ignored, {reason}; {} ({}=1 makes them fail)",
                    if *n == 1 { "" } else { "s" },
                    service.hint(),
                    service.required_by()
                );
            }
        }
        libtest_mimic::run(&args, self.trials).exit()
    }
}

/// Adds tests that need one service ([`Tests::needs`]).
#[derive(Debug)]
pub struct Needing<'a> {
    tests: &'a mut Tests,
    service: Service,
}

impl Needing<'_> {
    /// A plain test (`#[test]`) that needs the service.
    pub fn sync(self, name: &str, test: impl FnOnce() + Send + 'static) {
        self.tests.gated(self.service, name, Box::new(test));
    }

    /// A test on a current-thread runtime (`#[tokio::test]`) that needs the service.
    pub fn current<F>(self, name: &str, test: impl FnOnce() -> F + Send + 'static)
    where
        F: Future<Output = ()>,
    {
        self.sync(name, move || Runtime::Current.block_on(test()));
    }

    /// A test on a paused clock (`#[tokio::test(start_paused = true)]`) that needs the service.
    pub fn paused<F>(self, name: &str, test: impl FnOnce() -> F + Send + 'static)
    where
        F: Future<Output = ()>,
    {
        self.sync(name, move || Runtime::Paused.block_on(test()));
    }

    /// A test on a two-thread runtime that needs the service.
    pub fn multi_thread<F>(self, name: &str, test: impl FnOnce() -> F + Send + 'static)
    where
        F: Future<Output = ()>,
    {
        self.sync(name, move || Runtime::MultiThread.block_on(test()));
    }
}
