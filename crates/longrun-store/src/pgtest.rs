//! A throwaway PostgreSQL cluster for tests, without docker: the machine's
//! `initdb`/`pg_ctl` on a free port, started once per test process (as the
//! unprivileged `postgres` user when running as root, since `initdb` refuses
//! root), one database per test. When the binaries are missing the caller is
//! told so (`None`); with `LONGRUN_REQUIRE_PEERS` set that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// A throwaway PostgreSQL cluster, run as the unprivileged `postgres` user
/// and stopped and removed when the process that started it exits.
pub struct Cluster {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    base: PathBuf,
    pg_ctl: PathBuf,
    options: String,
}

fn peers_required() -> bool {
    std::env::var_os("LONGRUN_REQUIRE_PEERS").is_some_and(|v| v != "0")
}

fn find_bin(name: &str) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).collect())
        .unwrap_or_default();
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin").join(name)).collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev());
    }
    candidates.into_iter().find(|p| p.is_file())
}

#[allow(unsafe_code)]
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    unsafe { libc_geteuid() == 0 }
}

#[allow(unsafe_code)]
unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Runs a PostgreSQL binary, as `postgres` when we are root.
fn run_pg(bin: &Path, args: &[&str]) -> std::io::Result<std::process::Output> {
    if is_root() {
        Command::new("runuser")
            .arg("-u")
            .arg("postgres")
            .arg("--")
            .arg(bin)
            .args(args)
            .output()
    } else {
        Command::new(bin).args(args).output()
    }
}

/// A cluster that commits durably (fsync on), for benchmarks; the test
/// cluster trades durability for speed.
pub fn start_durable() -> Result<Cluster, String> {
    start_with(true, "d")
}

fn start() -> Result<Cluster, String> {
    start_with(false, "t")
}

/// A durable cluster of the calling test's own, for a test that stops it
/// hard and starts it again (an outage drill: with the shared cluster's
/// `synchronous_commit=off`, an immediate stop would lose acknowledged
/// commits by design); `None` (said loudly) when it cannot run here.
pub fn private_cluster() -> Option<Cluster> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    match start_with(true, &format!("p{}", NEXT.fetch_add(1, Ordering::SeqCst))) {
        Ok(c) => Some(c),
        Err(why) => {
            assert!(
                !peers_required(),
                "LONGRUN_REQUIRE_PEERS is set but PostgreSQL cannot run: {why}"
            );
            eprintln!("SKIPPED: a PostgreSQL outage test ({why})");
            None
        }
    }
}

fn start_with(durable: bool, name: &str) -> Result<Cluster, String> {
    let initdb = find_bin("initdb").ok_or("initdb not found")?;
    let pg_ctl = find_bin("pg_ctl").ok_or("pg_ctl not found")?;
    let base = std::env::temp_dir().join(format!("longrun-pg-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).map_err(|e| e.to_string())?;
    if is_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(&base)
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err("could not hand the cluster directory to the postgres user".into());
        }
    }
    let data = base.join("data");
    let out = run_pg(
        &initdb,
        &[
            "-D",
            data.to_str().unwrap(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-locale",
            "-E",
            "UTF8",
        ],
    )
    .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("initdb failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let speed = if durable {
        ""
    } else {
        " -c fsync=off -c synchronous_commit=off"
    };
    let options = format!(
        "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=400{speed}",
        base.display()
    );
    let cluster = Cluster {
        port,
        base: base.clone(),
        pg_ctl: pg_ctl.clone(),
        options,
    };
    cluster.start_again()?;
    // Stop the cluster when this test process ends, however it ends.
    let stop = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {runas}{pg_ctl} -D {data} -m immediate stop >/dev/null 2>&1; rm -rf {base}",
        pid = std::process::id(),
        runas = if is_root() { "runuser -u postgres -- " } else { "" },
        pg_ctl = pg_ctl.display(),
        data = data.display(),
        base = base.display(),
    );
    Command::new("sh")
        .arg("-c")
        .arg(stop)
        .spawn()
        .map_err(|e| e.to_string())?;
    Ok(cluster)
}

/// A test that needs more than the cluster (a contrib extension) and
/// cannot have it: said loudly, and a failure with `LONGRUN_REQUIRE_PEERS`.
pub fn skipped(test: &str, why: &str) {
    assert!(
        !peers_required(),
        "LONGRUN_REQUIRE_PEERS is set but {test} cannot run: {why}"
    );
    eprintln!("SKIPPED: {test} ({why})");
}

/// The process's cluster, started on first use; `None` (said loudly) when it
/// cannot run here.
pub fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| match start() {
            Ok(c) => Some(c),
            Err(why) => {
                assert!(
                    !peers_required(),
                    "LONGRUN_REQUIRE_PEERS is set but PostgreSQL cannot run: {why}"
                );
                eprintln!("SKIPPED: the PostgreSQL tests ({why})");
                None
            }
        })
        .as_ref()
}

impl Cluster {
    fn data(&self) -> PathBuf {
        self.base.join("data")
    }

    /// Starts the (stopped) cluster and waits until it accepts connections.
    pub fn start_again(&self) -> Result<(), String> {
        let (data, log) = (self.data(), self.base.join("log"));
        let out = run_pg(
            &self.pg_ctl,
            &[
                "-D",
                data.to_str().unwrap(),
                "-o",
                &self.options,
                "-l",
                log.to_str().unwrap(),
                "-w",
                "start",
            ],
        )
        .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("pg_ctl start failed: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(())
    }

    /// Stops the cluster hard (`pg_ctl stop -m immediate`): no checkpoint,
    /// connections cut, crash recovery on the next start.
    pub fn stop_immediately(&self) {
        let data = self.data();
        let out = run_pg(
            &self.pg_ctl,
            &["-D", data.to_str().unwrap(), "-m", "immediate", "-w", "stop"],
        )
        .expect("pg_ctl runs");
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A fresh, empty database; returns its URL.
    pub async fn database(&self) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("t{}_{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        let admin = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
            .await
            .expect("connect to the test cluster");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create a test database");
        let _ = &self.base;
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }
}
