//! Servers of a test's own, to stop and start again: a Postgres cluster (`initdb` and `pg_ctl`
//! in a temporary directory) and a `redis-server` with an append-only file, each on a free port
//! of 127.0.0.1, stopped and removed on drop. For the tests and soaks that take a store down in
//! the middle of a run.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A throwaway Postgres cluster of our own (`initdb` and `pg_ctl` in a temporary directory, on
/// a free port of 127.0.0.1), stopped and removed on drop. As root it runs as the `postgres`
/// system user, since `initdb` refuses root.
#[derive(Debug)]
pub struct PgCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl PgCluster {
    fn command(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        if is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            Command::new(path)
        }
    }

    /// A new cluster, initialised and started; an error says what is missing.
    pub fn start() -> Result<PgCluster, String> {
        let bin = crate::pg_bin_dir().ok_or("no initdb (install Debian's postgresql)")?;
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        if is_root() {
            let owned = Command::new("chown")
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
        let cluster = PgCluster { bin, dir, port };
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
            .stdout(Stdio::null())
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

    /// Stops the server at once, as a crash would (`pg_ctl stop -m immediate`: no shutdown
    /// checkpoint; what was committed is recovered from the WAL at the next start).
    pub fn crash(&self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
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

impl Drop for PgCluster {
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
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// A `redis-server` of our own on a free port of 127.0.0.1, its data in a temporary directory as
/// an append-only file fsync'd on every write (`appendfsync always`), so that a restart keeps
/// what it acknowledged; killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    dir: tempfile::TempDir,
    /// Its port on 127.0.0.1.
    pub port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// A new server, started and answering; an error says what is missing.
    pub fn start() -> Result<RedisServer, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let mut server = RedisServer {
            dir,
            port,
            child: None,
        };
        server.resume()?;
        Ok(server)
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Starts the server (again) on the same port and data, and waits until it answers `PING`
    /// with `PONG` (at most 30 s): a restarted server answers `LOADING` while it reads its
    /// append-only file back.
    pub fn resume(&mut self) -> Result<(), String> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e} (install Debian's redis-server)"))?;
        self.child = Some(child);
        let give_up = Instant::now() + Duration::from_secs(10);
        while Instant::now() < give_up {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "redis-server did not listen on {} within 10 s",
            self.port
        ))
    }

    /// Kills the server with SIGKILL, as a crash would, and waits until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A PgBouncer of our own in front of a [`PgCluster`]: PgBouncer's defaults but `pool_mode =
/// transaction` and `auth_type = trust` (the user `postgres` in its auth file), listening on a
/// free port of 127.0.0.1. Its files are in the cluster's directory; it is killed on drop. As
/// root it runs as the `postgres` system user (`-u postgres`), since PgBouncer refuses root.
#[derive(Debug)]
pub struct PgBouncer {
    child: std::process::Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl PgBouncer {
    /// Starts PgBouncer in front of `cluster`, and waits until it accepts connections.
    pub fn start(cluster: &PgCluster) -> Result<PgBouncer, String> {
        PgBouncer::start_with(cluster, &[])
    }

    /// Starts PgBouncer in front of `cluster` as [`start`](Self::start) does, with `settings`
    /// (`name = value` lines of its `[pgbouncer]` section) added to its configuration.
    pub fn start_with(cluster: &PgCluster, settings: &[(&str, &str)]) -> Result<PgBouncer, String> {
        let extra: String = settings
            .iter()
            .map(|(name, value)| format!("{name} = {value}\n"))
            .collect();
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
                 pool_mode = transaction\n{extra}",
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
