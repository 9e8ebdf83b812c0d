//! Connecting the tests to a real Postgres server.
//!
//! The URL comes from `BACKSTOP_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`,
//! the throwaway cluster `.ci/run` starts). Each store gets a schema of its own. When the server
//! cannot be reached, a test prints a skip line and passes, unless `BACKSTOP_REQUIRE_POSTGRES=1`
//! (what `.ci/run` sets), when it fails: a missing Postgres never hides behind a green run.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "postgres")]
use tower_backstop::store::PostgresStore;

pub fn postgres_url() -> String {
    std::env::var("BACKSTOP_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

pub fn postgres_required() -> bool {
    std::env::var("BACKSTOP_REQUIRE_POSTGRES").is_ok_and(|v| v == "1")
}

/// A fresh schema name for `test`: `bt_`, the test's name (cut to fit), a random suffix.
pub fn fresh_schema(test: &str) -> String {
    let name: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .take(36)
        .collect();
    format!("bt_{name}_{:016x}", rand::random::<u64>())
}

/// A store in a fresh schema, or `None` (after a skip line) when Postgres is unreachable and
/// not required.
#[cfg(feature = "postgres")]
pub async fn postgres_store(test: &str) -> Option<PostgresStore> {
    let url = postgres_url();
    match PostgresStore::connect(&url)
        .schema(fresh_schema(test))
        .await
    {
        Ok(store) => Some(store),
        Err(e) => skip(test, &url, &e),
    }
}

/// Without the `postgres` feature there is no Postgres store to test: a skip line (even when
/// Postgres is required: the build left the store out on purpose).
#[cfg(not(feature = "postgres"))]
pub async fn postgres_store(test: &str) -> Option<std::convert::Infallible> {
    eprintln!("SKIPPED {test}: built without the `postgres` feature (use --all-features)");
    None
}

pub fn skip<T>(test: &str, url: &str, error: &dyn std::fmt::Display) -> Option<T> {
    if postgres_required() {
        panic!(
            "{test}: postgres is required (BACKSTOP_REQUIRE_POSTGRES=1) but unreachable at {url}: \
             {error}"
        );
    }
    eprintln!(
        "SKIPPED {test}: no postgres at {url} ({error}); start a server or set \
         BACKSTOP_POSTGRES_URL (BACKSTOP_REQUIRE_POSTGRES=1 makes this a failure)"
    );
    None
}

/// A throwaway Postgres cluster of our own (`initdb` and `pg_ctl` in a temporary directory, on
/// a free port of 127.0.0.1), stopped and removed on drop. As root it runs as the `postgres`
/// system user, since `initdb` refuses root.
pub struct Cluster {
    bin: std::path::PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
}

impl Cluster {
    /// Where `initdb` is: `BACKSTOP_PG_BIN`, else on `PATH`, else the newest
    /// `/usr/lib/postgresql/*/bin` (Debian's layout).
    fn bin_dir() -> Option<std::path::PathBuf> {
        if let Ok(dir) = std::env::var("BACKSTOP_PG_BIN") {
            return Some(dir.into());
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

    fn command(&self, tool: &str) -> std::process::Command {
        let path = self.bin.join(tool);
        if is_root() {
            let mut cmd = std::process::Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            std::process::Command::new(path)
        }
    }

    /// A new cluster, initialised and started; an error says what is missing.
    pub fn start() -> Result<Cluster, String> {
        let bin = Cluster::bin_dir().ok_or("no initdb (install Debian's postgresql)")?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        if is_root() {
            let owned = std::process::Command::new("chown")
                .arg("postgres")
                .arg(dir.path())
                .status()
                .map_err(|e| e.to_string())?;
            if !owned.success() {
                return Err("chown postgres failed (no postgres user?)".into());
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let cluster = Cluster { bin, dir, port };
        let init = cluster
            .command("initdb")
            .arg("-D")
            .arg(cluster.dir.path().join("data"))
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
            ])
            .stdout(std::process::Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if !init.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&init.stderr)
            ));
        }
        cluster.resume()?;
        Ok(cluster)
    }

    /// The URL of the cluster's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server (again), and waits until it accepts connections.
    pub fn resume(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-o", &options, "-l"])
            .arg(self.dir.path().join("log"))
            .args(["-w", "start"])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl start failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Stops the server (`pg_ctl stop -m fast`: connections are cut, what was committed stays).
    pub fn stop(&self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "fast", "-w", "stop"])
            .output();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}
