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

/// A Redis primary, one replica and one Sentinel of our own on free ports of 127.0.0.1 (no
/// persistence; files in a temporary directory; the primary named `backstop`, failed over one
/// second after it stops answering), killed on drop: for a primary killed under load. Uses the
/// `redis-server`, `redis-sentinel` and `redis-cli` binaries.
#[derive(Debug)]
pub struct RedisSentinelSet {
    dir: tempfile::TempDir,
    /// The first primary's port.
    pub primary: u16,
    /// The replica's port (the primary after a failover).
    pub replica: u16,
    /// The Sentinel's port.
    pub sentinel: u16,
    children: Vec<Child>,
    first: Option<Child>,
}

impl RedisSentinelSet {
    /// The three started, the replica in sync and known to the Sentinel (at most 30 s).
    pub fn start() -> Result<RedisSentinelSet, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .map_err(|e| e.to_string())
        };
        let (primary, replica, sentinel) = (port()?, port()?, port()?);
        let root = dir.path().to_path_buf();
        let server = move |port: u16, of: Option<u16>| -> Result<Child, String> {
            let data = root.join(port.to_string());
            std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
            let mut cmd = Command::new("redis-server");
            cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--dir"])
                .arg(&data);
            if let Some(of) = of {
                cmd.args(["--replicaof", "127.0.0.1", &of.to_string()]);
            }
            cmd.stdout(Stdio::null())
                .spawn()
                .map_err(|e| format!("redis-server: {e}"))
        };
        let first = server(primary, None)?;
        let mut set = RedisSentinelSet {
            primary,
            replica,
            sentinel,
            children: Vec::new(),
            first: Some(first),
            dir,
        };
        set.children.push(server(replica, Some(primary))?);
        set.wait(replica, &["INFO", "replication"], "master_link_status:up")?;
        let conf = set.dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor backstop 127.0.0.1 {primary} 1\n\
                 sentinel down-after-milliseconds backstop 1000\n\
                 sentinel failover-timeout backstop 10000\n",
                set.dir.path().display()
            ),
        )
        .map_err(|e| e.to_string())?;
        set.children.push(
            Command::new("redis-sentinel")
                .arg(&conf)
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| format!("redis-sentinel: {e}"))?,
        );
        set.wait(
            sentinel,
            &["SENTINEL", "REPLICAS", "backstop"],
            &replica.to_string(),
        )?;
        Ok(set)
    }

    /// The Sentinel's URL (`redis://127.0.0.1:PORT`).
    pub fn sentinel_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.sentinel)
    }

    /// Kills the first primary with SIGKILL, as a crash would.
    pub fn kill_primary(&mut self) {
        if let Some(mut child) = self.first.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits until the Sentinel names the replica as the primary (at most 30 s).
    pub fn wait_promoted(&self) -> Result<(), String> {
        self.wait(
            self.sentinel,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "backstop"],
            &self.replica.to_string(),
        )?;
        self.wait(self.replica, &["ROLE"], "master")
    }

    /// Waits until `redis-cli -p port args…` prints something that holds `want`.
    fn wait(&self, port: u16, args: &[&str], want: &str) -> Result<(), String> {
        let give_up = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        while Instant::now() < give_up {
            let out = Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .args(args)
                .output()
                .map_err(|e| format!("redis-cli: {e}"))?;
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            if last.contains(want) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "{args:?} on {port} never held {want:?}; last: {last}"
        ))
    }
}

impl Drop for RedisSentinelSet {
    fn drop(&mut self) {
        self.kill_primary();
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
