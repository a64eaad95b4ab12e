//! The SandboxConfig's `services`: helper processes (a mock tracking API, a
//! fixture database) started before the first episode and stopped after the
//! last, on 127.0.0.1. Each runs in its own process group, so stopping it —
//! or dropping [`RunningServices`] on Ctrl-C or a panic — takes its children
//! down too. A starter killed outright (SIGKILL, the OOM killer) stops
//! nothing itself: each service then runs under a keeper, as an exec tool
//! does (`crate::tools::group_keeper`), which the kernel signals when the
//! starter dies and which SIGKILLs the service's whole process group, what
//! the service started included (a parent-death signal on the service
//! alone left its children running). Its output goes to
//! `services/<name>.log` in the run directory, so a service that dies is
//! explained, not just missing.
//!
//! A service is refused before it starts when its program cannot start
//! (field `spec.services.NAME.command[0]`, judged as an exec tool's) or when
//! another process holds its fixed `port` (that process would answer the
//! readiness probe); it is not ready when it has exited by the time its
//! probe passes. One that exits later, while the episodes use it, is
//! returned by [`RunningServices::exited`] for the run to report, and
//! [`RunningServices::watch`] lets the tools that call it tell so: a failed
//! call to a service that has exited is a `service_exited` error naming it,
//! its exit status and its log (not a bare `transport` error counted as the
//! agent's).
//!
//! [`RunningServices::expand`] turns the spec's `$(services.NAME.url)`
//! references into the addresses the services actually got. A process that
//! must exit at once, skipping destructors (a second Ctrl-C), calls
//! [`kill_all_now`] first: a terminal's Ctrl-C does not reach a service's
//! own process group.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use basecamp_api::service::{ServiceRefError, ServiceSpec, expand_service_refs, service_refs};
use basecamp_api::{SandboxConfigSpec, ToolSpec};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::driver::StopSignal;

/// The process groups of the services started and not yet stopped.
static LIVE_GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn live_groups() -> std::sync::MutexGuard<'static, Vec<i32>> {
    LIVE_GROUPS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// SIGKILLs every service still running (and its children), at once.
pub fn kill_all_now() {
    for group in std::mem::take(&mut *live_groups()) {
        let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
    }
}

/// How long a stopping service gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);
const READY_POLL: Duration = Duration::from_millis(25);

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("service {name}: cannot find a free port on 127.0.0.1: {source}")]
    Port {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "service {name}: port {port} on 127.0.0.1 is already in use by another process (or by a service started \
         before it with the same fixed port: another of this sandbox's, or another variant's in `basecamp run`), so \
         its readiness probe would be answered by that process; stop it, or set spec.services.{name}.port to 0 (or \
         remove it) for a free port"
    )]
    PortInUse { name: String, port: u16 },
    /// Found before any service starts: every call to the service would fail.
    #[error("{field}: {message}")]
    Program { field: String, message: String },
    #[error("service {name}: cannot start {program:?}: {source}")]
    Spawn {
        name: String,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("service {name} exited with {status} before it was ready; its output ({log}):\n{tail}")]
    Exited { name: String, status: String, log: String, tail: String },
    #[error(
        "service {name} was not ready within {timeout:?} ({probe}); its output ({log}):\n{tail}\nraise readyTimeout or fix the service"
    )]
    NotReady { name: String, timeout: Duration, probe: String, log: String, tail: String },
    #[error("{0}")]
    Reference(#[from] ServiceRefError),
}

impl ServiceError {
    pub fn category(&self) -> &'static str {
        match self {
            Self::Port { .. } | Self::Spawn { .. } => "ServiceStart",
            Self::PortInUse { .. } => "ServicePortInUse",
            Self::Program { .. } => "ServiceProgramUnavailable",
            Self::Exited { .. } | Self::NotReady { .. } => "ServiceNotReady",
            Self::Reference(_) => "UnknownService",
        }
    }
}

/// One started service.
#[derive(Debug)]
struct Running {
    addr: SocketAddr,
    process: Arc<ServiceProcess>,
    /// Its exit was returned by [`RunningServices::exited`].
    exit_reported: bool,
}

/// A started service's process, shared with the tools that call it
/// ([`ServiceWatch`]): a failed call asks it whether the service is gone.
#[derive(Debug)]
struct ServiceProcess {
    name: String,
    /// Its keeper's process id (on Linux the service runs under a keeper,
    /// see `crate::tools::group_keeper`), which is also the process group's.
    pid: i32,
    /// The keeper, whose exit status is the service's.
    child: Mutex<Child>,
    log: PathBuf,
    /// Set before the run stops it: a stopped service did not die.
    stopping: AtomicBool,
    /// Its exit, once seen (its log's tail is read once).
    exit: OnceLock<ServiceExit>,
}

impl ServiceProcess {
    /// How it exited, if it has and the run did not stop it.
    fn exit(&self) -> Option<&ServiceExit> {
        if let Some(exit) = self.exit.get() {
            return Some(exit);
        }
        if self.stopping.load(Ordering::Acquire) {
            return None;
        }
        let status = self.try_wait()?;
        // Stopped between the two looks: the status is the run's SIGTERM.
        if self.stopping.load(Ordering::Acquire) {
            return None;
        }
        Some(self.exit.get_or_init(|| ServiceExit {
            service: self.name.clone(),
            status: status.to_string(),
            tail: log_tail(&self.log),
            log: self.log.clone(),
        }))
    }

    fn try_wait(&self) -> Option<std::process::ExitStatus> {
        self.child.lock().unwrap_or_else(PoisonError::into_inner).try_wait().ok()?
    }
}

/// A service that exited while the run was using it (not stopped by the
/// run): every call to it failed from then on.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServiceExit {
    pub service: String,
    /// As the OS says it: `exit status: 3`, `signal: 9 (SIGKILL)`.
    pub status: String,
    /// Its output: `services/<name>.log`.
    pub log: PathBuf,
    /// The last lines of that log.
    pub tail: String,
}

impl std::fmt::Display for ServiceExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "service {} exited with {} during the run; the tool calls to it failed from then on (error type \
             `service_exited`: not the agent's failures); its output ({}) ends:\n{}",
            self.service,
            self.status,
            self.log.display(),
            self.tail
        )
    }
}

/// The started services of one sandbox; stopped on drop.
#[derive(Debug, Default)]
pub struct RunningServices {
    running: Vec<Running>,
}

impl RunningServices {
    /// Starts every service of `services` (commands relative to `base_dir`,
    /// logs in `log_dir`) and waits until each is ready. Once `stop` fires
    /// (Ctrl-C, SIGTERM) the waits end at once, ready or not: no episode
    /// starts after a stop, and the caller goes on to its summary (or exit)
    /// instead of waiting up to each `readyTimeout`.
    pub fn start(
        services: &BTreeMap<String, ServiceSpec>,
        base_dir: &Path,
        log_dir: &Path,
        stop: &StopSignal,
    ) -> Result<Self, ServiceError> {
        for (name, spec) in services {
            if let Some(message) = program_problem(spec, base_dir) {
                return Err(ServiceError::Program { field: format!("spec.services.{name}.command[0]"), message });
            }
        }
        let mut started = Self::default();
        for (name, spec) in services {
            let running = start_one(name, spec, base_dir, log_dir)?;
            started.running.push(running);
            let running = started.running.last_mut().expect("just pushed");
            wait_ready(running, spec, stop)?;
        }
        Ok(started)
    }

    /// The services that have exited since they got ready, each returned
    /// once. A service the run stopped is not among them.
    pub fn exited(&mut self) -> Vec<ServiceExit> {
        let mut exits = Vec::new();
        for running in self.running.iter_mut().filter(|r| !r.exit_reported) {
            if let Some(exit) = running.process.exit() {
                running.exit_reported = true;
                exits.push(exit.clone());
            }
        }
        exits
    }

    /// The address a service listens on.
    pub fn addr(&self, name: &str) -> Option<SocketAddr> {
        self.running.iter().find(|r| r.process.name == name).map(|r| r.addr)
    }

    /// Which of these services each tool of `spec` (as written, before
    /// [`Self::expand`]) calls, for the executor to ask on a failed call:
    /// the services its texts reference (`$(services.NAME.url)`), and a
    /// service with a fixed port whose address a text spells out
    /// (`http://127.0.0.1:8080/...`, `localhost:8080`).
    pub fn watch(&self, spec: &SandboxConfigSpec) -> ServiceWatch {
        let mut tools = BTreeMap::new();
        for (name, tool) in &spec.tools {
            let mut tool = tool.clone();
            let texts = tool_texts_mut(&mut tool);
            let calls: Vec<Arc<ServiceProcess>> = self
                .running
                .iter()
                .filter(|running| texts.iter().any(|text| names_service(text, &running.process.name, running.addr)))
                .map(|running| running.process.clone())
                .collect();
            if !calls.is_empty() {
                tools.insert(name.clone(), calls);
            }
        }
        ServiceWatch { tools: Arc::new(tools) }
    }

    fn lookup(&self, service: &str, attribute: &str) -> Option<String> {
        let addr = self.addr(service)?;
        Some(match attribute {
            "url" => format!("http://{addr}"),
            "host" => addr.ip().to_string(),
            _ => addr.port().to_string(),
        })
    }

    /// `spec` with every `$(services.…)` reference in its tools replaced by
    /// the running services' addresses.
    pub fn expand(&self, spec: &SandboxConfigSpec) -> Result<SandboxConfigSpec, ServiceError> {
        let lookup = |s: &str, a: &str| self.lookup(s, a);
        let mut spec = spec.clone();
        for tool in spec.tools.values_mut() {
            for text in tool_texts_mut(tool) {
                *text = expand_service_refs(text, lookup)?;
            }
        }
        Ok(spec)
    }

    /// Stops every service: SIGTERM to its process group, SIGKILL after a grace period.
    pub fn stop(&mut self) {
        for running in &mut self.running {
            stop_one(running);
        }
        self.running.clear();
    }
}

/// The texts of a tool that may name a service: an HTTP tool's URL, body
/// and header values, an exec tool's command and environment values.
fn tool_texts_mut(tool: &mut ToolSpec) -> Vec<&mut String> {
    let mut texts = Vec::new();
    if let Some(http) = &mut tool.http {
        texts.push(&mut http.url);
        texts.extend(http.body.as_mut());
        texts.extend(http.headers.values_mut());
    }
    if let Some(exec) = &mut tool.exec {
        texts.extend(exec.command.iter_mut());
        texts.extend(exec.env.values_mut());
    }
    texts
}

/// Whether `text` calls service `name`: a reference to it, or its fixed
/// address written out (`127.0.0.1:80` in `http://127.0.0.1:8080` is not).
fn names_service(text: &str, name: &str, addr: SocketAddr) -> bool {
    let referenced = service_refs(text).is_ok_and(|refs| refs.iter().any(|r| r.service == name));
    let spelled_out = |host: &str| {
        let address = format!("{host}:{}", addr.port());
        text.match_indices(&address).any(|(at, _)| {
            let after = text[at + address.len()..].chars().next();
            !after.is_some_and(|c| c.is_ascii_digit())
        })
    };
    referenced || spelled_out("127.0.0.1") || spelled_out("localhost")
}

/// Which services each tool calls, and whether one has exited; built by
/// [`RunningServices::watch`] and held by the executor. Cheap to clone;
/// empty (nothing to ask) by default.
#[derive(Debug, Clone, Default)]
pub struct ServiceWatch {
    tools: Arc<BTreeMap<String, Vec<Arc<ServiceProcess>>>>,
}

impl ServiceWatch {
    /// Whether `tool` calls any service.
    pub fn calls_a_service(&self, tool: &str) -> bool {
        self.tools.contains_key(tool)
    }

    /// The first service `tool` calls that has exited. With a `grace`,
    /// one still running is looked at again until it passes: a service
    /// that crashed on this very call has closed its sockets (the call saw
    /// the connection reset) a moment before the kernel says it exited.
    pub async fn exited_for(&self, tool: &str, grace: Duration) -> Option<ServiceExit> {
        let services = self.tools.get(tool)?;
        let deadline = Instant::now() + grace;
        loop {
            if let Some(exit) = services.iter().find_map(|s| s.exit()) {
                return Some(exit.clone());
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(EXIT_POLL).await;
        }
    }
}

/// How often [`ServiceWatch::exited_for`] looks during its grace.
const EXIT_POLL: Duration = Duration::from_millis(5);

impl Drop for RunningServices {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr()?.port())
}

fn log_path(log_dir: &Path, name: &str) -> PathBuf {
    log_dir.join(format!("{name}.log"))
}

/// Whether another process holds `port` on 127.0.0.1: its answers would
/// pass the service's readiness probe while the service itself dies of
/// EADDRINUSE.
fn port_in_use(port: u16) -> bool {
    matches!(TcpListener::bind((Ipv4Addr::LOCALHOST, port)), Err(e) if e.kind() == std::io::ErrorKind::AddrInUse)
}

/// Where a service's program is: a relative path with a directory part is
/// the manifest's file (`base_dir`'s), a bare name is looked up on `PATH`.
fn program_path(program: &str, base_dir: &Path) -> PathBuf {
    if program.contains('/') && Path::new(program).is_relative() { base_dir.join(program) } else { program.into() }
}

/// Why a service's program (`command[0]`) cannot be started from
/// `base_dir`, as an exec tool's is judged: not on `PATH` (the service's
/// own `env` `PATH` when it sets one), not there, not executable. `None`
/// when it can start (or there is no command, which validation refuses).
pub fn program_problem(spec: &ServiceSpec, base_dir: &Path) -> Option<String> {
    let program = spec.command.first()?;
    let search = spec.env.get("PATH").map(std::ffi::OsString::from);
    crate::tools::exec::program_problem(
        program,
        &program_path(program, base_dir),
        search,
        "a relative path is taken from the manifest's directory (the working directory in a pod)",
    )
}

fn start_one(name: &str, spec: &ServiceSpec, base_dir: &Path, log_dir: &Path) -> Result<Running, ServiceError> {
    let port = match spec.port {
        Some(port) if port != 0 => {
            if port_in_use(port) {
                return Err(ServiceError::PortInUse { name: name.into(), port });
            }
            port
        }
        _ => free_port().map_err(|source| ServiceError::Port { name: name.into(), source })?,
    };
    let program = spec.command.first().cloned().unwrap_or_default();
    let spawn_error = |source| ServiceError::Spawn { name: name.into(), program: program.clone(), source };
    std::fs::create_dir_all(log_dir).map_err(spawn_error)?;
    let log = std::fs::File::create(log_path(log_dir, name)).map_err(spawn_error)?;
    let log_err = log.try_clone().map_err(spawn_error)?;
    let mut command = Command::new(program_path(&program, base_dir));
    command
        .args(&spec.command[1.min(spec.command.len())..])
        .current_dir(base_dir)
        .envs(&spec.env)
        .env("HOST", "127.0.0.1")
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .process_group(0);
    #[cfg(target_os = "linux")]
    {
        let starter = nix::unistd::getpid();
        // SAFETY: between fork and exec the closure makes only async-signal-safe
        // calls and allocates nothing (see group_keeper). The keeper's
        // parent-death signal follows the forking thread: services are
        // started from one that outlives them (the binaries' main thread).
        unsafe {
            command.pre_exec(move || crate::tools::group_keeper::split_off_the_tool(starter));
        }
    }
    let child = command.spawn().map_err(spawn_error)?;
    let pid = child.id() as i32;
    live_groups().push(pid);
    let process = ServiceProcess {
        name: name.into(),
        pid,
        child: Mutex::new(child),
        log: log_path(log_dir, name),
        stopping: AtomicBool::new(false),
        exit: OnceLock::new(),
    };
    Ok(Running {
        addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        process: Arc::new(process),
        exit_reported: false,
    })
}

/// The most of a service's log read for its tail.
const TAIL_BYTES: u64 = 16 << 10;

/// The last 20 lines of a service's log, from at most its last
/// [`TAIL_BYTES`] (a chatty service's log may be gigabytes; bytes that are
/// not UTF-8 shown as U+FFFD).
fn log_tail(log: &Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let mut end = Vec::new();
    if let Ok(mut file) = std::fs::File::open(log) {
        let len = file.metadata().map_or(0, |m| m.len());
        let start = len.saturating_sub(TAIL_BYTES);
        if file.seek(SeekFrom::Start(start)).is_ok() {
            let _ = file.take(TAIL_BYTES).read_to_end(&mut end);
        }
        // The first line read is likely a part of one, unless it is all there is.
        let partial = end.iter().position(|&b| b == b'\n').filter(|&i| start > 0 && i + 1 < end.len());
        if let Some(newline) = partial {
            end.drain(..=newline);
        }
    }
    let text = String::from_utf8_lossy(&end);
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
    if tail.is_empty() { "(nothing)".into() } else { tail }
}

/// Polls until the service answers its probe, exits, the timeout passes, or `stop` fires.
fn wait_ready(running: &mut Running, spec: &ServiceSpec, stop: &StopSignal) -> Result<(), ServiceError> {
    let timeout = spec.ready_timeout();
    let deadline = Instant::now() + timeout;
    let probe = match &spec.ready_path {
        Some(path) => format!("GET http://{}{path} answering 2xx", running.addr),
        None => format!("a TCP connection to {}", running.addr),
    };
    let exited = |running: &mut Running| {
        let process = &running.process;
        let status = process.try_wait()?;
        Some(ServiceError::Exited {
            name: process.name.clone(),
            status: status.to_string(),
            log: process.log.display().to_string(),
            tail: log_tail(&process.log),
        })
    };
    loop {
        if let Some(error) = exited(running) {
            return Err(error);
        }
        let ready = match &spec.ready_path {
            Some(path) => http_ok(running.addr, path),
            None => std::net::TcpStream::connect_timeout(&running.addr, READY_POLL).is_ok(),
        };
        if ready || stop.is_cancelled() {
            // What answered may have been another process on the port: a
            // service already gone is not ready.
            return exited(running).map_or(Ok(()), Err);
        }
        if Instant::now() >= deadline {
            let error = ServiceError::NotReady {
                name: running.process.name.clone(),
                timeout,
                probe,
                log: running.process.log.display().to_string(),
                tail: log_tail(&running.process.log),
            };
            stop_one(running);
            return Err(error);
        }
        std::thread::sleep(READY_POLL);
    }
}

/// A minimal HTTP/1.0 GET: enough for a readiness probe without a client.
fn http_ok(addr: SocketAddr, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, READY_POLL * 4) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 16];
    let Ok(n) = stream.read(&mut head) else { return false };
    // "HTTP/1.x 2xx"
    n >= 12 && head.starts_with(b"HTTP/1.") && head[9] == b'2'
}

fn stop_one(running: &mut Running) {
    running.process.stopping.store(true, Ordering::Release);
    terminate(&running.process);
    live_groups().retain(|group| *group != running.process.pid);
}

/// SIGTERM to the service's process group, SIGKILL after [`STOP_GRACE`].
fn terminate(process: &ServiceProcess) {
    if process.try_wait().is_some() {
        return;
    }
    let group = Pid::from_raw(process.pid);
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if process.try_wait().is_some() {
            return;
        }
        std::thread::sleep(READY_POLL);
    }
    let _ = killpg(group, Signal::SIGKILL);
    let _ = process.child.lock().unwrap_or_else(PoisonError::into_inner).wait();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn python_service(script: &str) -> ServiceSpec {
        ServiceSpec {
            command: vec!["python3".into(), "-c".into(), script.into()],
            ready_timeout: Some(std::time::Duration::from_secs(5).into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_service_starts_on_a_free_port_answers_and_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let script = "import http.server,os\n\
            class H(http.server.BaseHTTPRequestHandler):\n  def do_GET(self):\n    self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n\
            http.server.HTTPServer((os.environ['HOST'], int(os.environ['PORT'])), H).serve_forever()";
        let mut spec = python_service(script);
        spec.ready_path = Some("/healthz".into());
        let services = BTreeMap::from([("tracking".to_string(), spec)]);
        let mut running = RunningServices::start(&services, dir.path(), dir.path(), &StopSignal::new()).unwrap();
        let addr = running.addr("tracking").unwrap();
        assert!(http_ok(addr, "/anything"));

        let mut sandbox = SandboxConfigSpec::default();
        let mut tool = basecamp_api::ToolSpec::default();
        tool.http = Some(basecamp_api::tool::HttpTool {
            url: "$(services.tracking.url)/orders/{{order_id}}".into(),
            ..Default::default()
        });
        sandbox.tools.insert("track".into(), tool);
        let expanded = running.expand(&sandbox).unwrap();
        assert_eq!(
            expanded.tools["track"].http.as_ref().unwrap().url,
            format!("http://{addr}/orders/{{{{order_id}}}}")
        );

        running.stop();
        assert!(!http_ok(addr, "/"), "the service is gone after stop");
    }

    #[test]
    fn a_service_that_dies_is_reported_with_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let services =
            BTreeMap::from([("db".to_string(), python_service("import sys; print('no fixture file'); sys.exit(3)"))]);
        let err = RunningServices::start(&services, dir.path(), dir.path(), &StopSignal::new()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("service db exited") && text.contains("no fixture file"), "{text}");
        assert_eq!(err.category(), "ServiceNotReady");
    }

    #[test]
    fn a_service_whose_program_cannot_start_is_refused_naming_the_field() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("plain.py"), "print('hi')\n").unwrap();
        let field = "spec.services.svc.command[0]";
        for (program, said) in [
            ("nosuchbinary-xyz", "\"nosuchbinary-xyz\" is not an executable on PATH".to_string()),
            ("services/missing.py", format!("({}) does not exist", dir.path().join("services/missing.py").display())),
            ("./plain.py", "is not executable (mode".to_string()),
        ] {
            let spec = ServiceSpec { command: vec![program.into()], ..Default::default() };
            let services = BTreeMap::from([("svc".to_string(), spec)]);
            // Before: `service svc: cannot start "nosuchbinary-xyz": No such file or directory`, no field.
            let err = RunningServices::start(&services, dir.path(), dir.path(), &StopSignal::new()).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with(&format!("{field}: ")), "{text}");
            assert!(text.contains(&said), "{program}: {text}");
            assert_eq!(err.category(), "ServiceProgramUnavailable");
        }
    }

    #[test]
    fn a_service_that_never_listens_times_out_and_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = python_service("import time; time.sleep(30)");
        spec.ready_timeout = Some(std::time::Duration::from_millis(300).into());
        let services = BTreeMap::from([("slow".to_string(), spec)]);
        let started = Instant::now();
        let err = RunningServices::start(&services, dir.path(), dir.path(), &StopSignal::new()).unwrap_err();
        assert!(err.to_string().contains("not ready within 300ms"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "the sleeper was killed, not waited for");
    }

    #[test]
    fn a_stop_ends_the_wait_for_readiness() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = python_service("import time; time.sleep(30)");
        spec.ready_timeout = Some(std::time::Duration::from_secs(20).into());
        let services = BTreeMap::from([("slow".to_string(), spec)]);
        let stop = StopSignal::new();
        let stopper = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            stopper.cancel();
        });
        let started = Instant::now();
        let mut running = RunningServices::start(&services, dir.path(), dir.path(), &stop).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "the wait ended with the stop");
        running.stop();
    }

    /// Answers every connection on `listener` with `200 OK`, like a server
    /// that happens to hold a service's port.
    fn squat(listener: TcpListener) {
        std::thread::spawn(move || {
            use std::io::{Read, Write};
            for mut stream in listener.incoming().flatten() {
                let mut request = [0u8; 512];
                let _ = stream.read(&mut request);
                let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok");
            }
        });
    }

    #[test]
    fn a_fixed_port_held_by_another_process_is_refused_before_the_service_starts() {
        let dir = tempfile::tempdir().unwrap();
        let squatter = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = squatter.local_addr().unwrap().port();
        squat(squatter);
        let script = "import http.server,os\n\
            class H(http.server.BaseHTTPRequestHandler):\n  def do_GET(self):\n    self.send_response(200); self.end_headers()\n\
            http.server.HTTPServer((os.environ['HOST'], int(os.environ['PORT'])), H).serve_forever()";
        let mut spec = python_service(script);
        spec.port = Some(port);
        spec.ready_path = Some("/healthz".into());
        let services = BTreeMap::from([("tracking".to_string(), spec)]);
        // Before: ready at once (the squatter answered), the service dead of EADDRINUSE.
        let err = RunningServices::start(&services, dir.path(), dir.path(), &StopSignal::new()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&format!("port {port} on 127.0.0.1 is already in use")), "{text}");
        assert!(text.contains("spec.services.tracking.port"), "{text}");
        assert_eq!(err.category(), "ServicePortInUse");
        assert!(!log_path(dir.path(), "tracking").exists(), "the service was not started");
    }

    /// The services' exits, polled until one is seen (a service that exits
    /// at once); fails after 10 s.
    fn wait_for_exits(running: &mut RunningServices) -> Vec<ServiceExit> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let exits = running.exited();
            if !exits.is_empty() || Instant::now() > deadline {
                return exits;
            }
            std::thread::sleep(READY_POLL);
        }
    }

    #[test]
    fn a_service_that_dies_during_the_run_is_named_with_its_status_and_log() {
        let dir = tempfile::tempdir().unwrap();
        let script = "import os,socket,sys\n\
            s=socket.socket(); s.bind((os.environ['HOST'], int(os.environ['PORT']))); s.listen()\n\
            c,_=s.accept(); c.close()\n\
            c,_=s.accept(); print('crashed on the first real request', flush=True); os._exit(3)";
        let services = BTreeMap::from([("tracking".to_string(), python_service(script))]);
        let mut running = RunningServices::start(&services, dir.path(), dir.path(), &StopSignal::new()).unwrap();
        assert!(running.exited().is_empty(), "alive after the probe");
        let addr = running.addr("tracking").unwrap();
        let _request = std::net::TcpStream::connect(addr).unwrap();
        let exits = wait_for_exits(&mut running);
        assert_eq!(exits.len(), 1, "{exits:?}");
        assert_eq!(exits[0].service, "tracking");
        assert_eq!(exits[0].status, "exit status: 3");
        assert_eq!(exits[0].log, log_path(dir.path(), "tracking"));
        assert!(exits[0].to_string().contains("crashed on the first real request"), "{}", exits[0]);
        // Told once: a second look finds nothing new, and stopping counts for nothing.
        assert!(running.exited().is_empty());
        running.stop();
    }

    /// Before: the whole log was read into memory for its last lines, and
    /// one byte that is not UTF-8 made it "(nothing)".
    #[test]
    fn a_log_s_tail_is_read_from_its_end_and_survives_bytes_that_are_not_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("svc.log");
        let mut text = b"early line\n".repeat(100_000);
        text.extend_from_slice(b"bad byte \xff here\n");
        for i in 0..30 {
            text.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        std::fs::write(&log, &text).unwrap();
        let tail = log_tail(&log);
        let lines: Vec<&str> = tail.lines().collect();
        assert_eq!(lines.len(), 20, "{tail}");
        assert_eq!((lines[0], lines[19]), ("line 10", "line 29"));
        // A short log is read whole, its first line included.
        std::fs::write(&log, b"only \xff line\n").unwrap();
        assert_eq!(log_tail(&log), "only \u{fffd} line");
        std::fs::write(&log, b"").unwrap();
        assert_eq!(log_tail(&log), "(nothing)");
    }

    #[test]
    fn a_fixed_address_names_its_service_only_when_the_port_ends_there() {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, 80));
        for (text, names) in [
            ("$(services.db.url)/x", true),
            ("$(services.other.url)/x", false),
            ("http://127.0.0.1:80/x", true),
            ("http://localhost:80", true),
            ("127.0.0.1:80", true),
            ("http://127.0.0.1:8080/x", false),
            ("http://localhost:800", false),
            ("http://127.0.0.1:8080/x then 127.0.0.1:80/y", true),
        ] {
            assert_eq!(names_service(text, "db", addr), names, "{text}");
        }
    }

    #[test]
    fn a_service_stopped_by_the_run_is_no_exit_to_report() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = python_service(
            "import os,socket,time\n\
            s=socket.socket(); s.bind((os.environ['HOST'], int(os.environ['PORT']))); s.listen(); time.sleep(60)",
        );
        spec.ready_timeout = Some(std::time::Duration::from_secs(20).into());
        let services = BTreeMap::from([("db".to_string(), spec)]);
        let mut running = RunningServices::start(&services, dir.path(), dir.path(), &StopSignal::new()).unwrap();
        assert!(running.exited().is_empty());
        running.stop();
        assert!(running.exited().is_empty());
    }
}
