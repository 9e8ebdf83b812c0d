//! Connecting the tests to a real Postgres server, at `BACKSTOP_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`, the throwaway cluster `.ci/run` starts). Each
//! store gets a schema of its own.
//!
//! A test that needs it is listed with `tests.needs(Service::Postgres)` (backstop-test-support),
//! which probes the server once: when it is missing, the test is reported as ignored with the
//! reason, or fails when `BACKSTOP_REQUIRE_POSTGRES=1` (what `.ci/run` sets). So here, a server
//! that cannot be reached is a failure. A test that starts a [`Cluster`] of its own needs
//! `Service::PostgresBinaries` instead.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "postgres")]
use tower_backstop::store::PostgresStore;

pub use backstop_test_support::postgres_url;

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

/// A store in a fresh schema.
#[cfg(feature = "postgres")]
pub async fn postgres_store(test: &str) -> PostgresStore {
    let url = postgres_url();
    match PostgresStore::connect(&url)
        .schema(fresh_schema(test))
        .await
    {
        Ok(store) => store,
        Err(e) => panic!("{test}: cannot connect to postgres at {url}: {e}"),
    }
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
        let bin =
            backstop_test_support::pg_bin_dir().ok_or("no initdb (install Debian's postgresql)")?;
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

/// A PgBouncer of our own in front of a [`Cluster`]: PgBouncer's defaults but `pool_mode =
/// transaction` and `auth_type = trust` (the user `postgres` in its auth file), listening on a
/// free port of 127.0.0.1. Its files are in the cluster's directory; it is killed on drop. As
/// root it runs as the `postgres` system user (`-u postgres`), since PgBouncer refuses root.
pub struct PgBouncer {
    child: std::process::Child,
    pub port: u16,
}

impl PgBouncer {
    /// Starts PgBouncer in front of `cluster`, and waits until it accepts connections.
    pub fn start(cluster: &Cluster) -> Result<PgBouncer, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let dir = cluster.dir.path();
        let users = dir.join("pgbouncer-users.txt");
        std::fs::write(&users, "\"postgres\" \"\"\n").map_err(|e| e.to_string())?;
        let config = dir.join("pgbouncer.ini");
        std::fs::write(
            &config,
            format!(
                "[databases]\n* = host=127.0.0.1 port={}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
                 listen_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                 pool_mode = transaction\n",
                cluster.port,
                users.display()
            ),
        )
        .map_err(|e| e.to_string())?;
        let mut cmd = std::process::Command::new("pgbouncer");
        if is_root() {
            cmd.args(["-u", "postgres"]);
        }
        let child = cmd
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("pgbouncer: {e}"))?;
        let bouncer = PgBouncer { child, port };
        // Waiting for the server to come up: at most 10 s.
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(bouncer);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Err(format!(
            "pgbouncer did not listen on 127.0.0.1:{port} within 10 s"
        ))
    }

    /// The URL of the cluster's `postgres` database through PgBouncer.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
