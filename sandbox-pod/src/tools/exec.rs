//! `exec` tools: a subprocess that reads the call's arguments as JSON on
//! stdin and prints its answer as JSON on stdout.
//!
//! The child runs in a process group of its own. When the call ends — in
//! any way, including a timeout that drops this future — the whole group is
//! killed, so a tool's grandchildren (a shell pipeline, a helper server)
//! never outlive the call. When this process dies without a chance to end
//! the call (SIGKILL), the tool's keeper kills the group instead: on Linux
//! the process spawned is not the tool itself but its `group_keeper`,
//! which forks the tool and ends as the tool does.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use super::{DEFAULT_MAX_RESPONSE_BYTES, ToolError, ToolOutput, excerpt};

/// How much of stderr (its end) is kept for an error message.
const STDERR_KEEP: usize = 2048;

/// How much of a failing tool's stdout its error quotes.
const STDOUT_QUOTED: usize = 512;

/// How long the pipes are still read after the tool exits, when a process
/// outside its group keeps them open.
const EXIT_DRAIN: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct ExecTool {
    /// argv: the program and its arguments (no shell).
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<PathBuf>,
    pub max_response_bytes: u64,
}

impl ExecTool {
    pub fn new(command: Vec<String>) -> Self {
        Self { command, env: Vec::new(), working_dir: None, max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES }
    }

    /// The program as it is started: a relative path with a `/` in it is
    /// taken from the working directory (made absolute, as the child starts
    /// in that directory), anything else as given (a bare name is looked up
    /// on `PATH`).
    pub fn program_path(&self) -> Option<PathBuf> {
        let program = self.command.first()?;
        Some(match &self.working_dir {
            Some(dir) if program.contains('/') && Path::new(program).is_relative() => {
                let path = dir.join(program);
                std::path::absolute(&path).unwrap_or(path)
            }
            _ => PathBuf::from(program),
        })
    }

    /// Why the program cannot be started, checked before any call: not
    /// there, not on `PATH` (the tool's own `env` `PATH` when it sets one,
    /// as for the call), a directory, or not executable. The working
    /// directory must be a directory too. `None` when it can start.
    pub fn cannot_start(&self) -> Option<ProgramProblem> {
        let program = self.command.first()?;
        if let Some(dir) = &self.working_dir
            && !dir.is_dir()
        {
            return Some(ProgramProblem::WorkingDir(format!("{} is not a directory", dir.display())));
        }
        let path = self.program_path()?;
        let search = self.env.iter().rev().find(|(k, _)| k == "PATH").map(|(_, v)| std::ffi::OsString::from(v));
        program_problem(
            program,
            &path,
            search,
            "a relative path is taken from the tool's workingDir (default: the manifest's directory, or --base-dir)",
        )
        .map(ProgramProblem::Program)
    }

    pub async fn call(&self, arguments: &Value) -> Result<ToolOutput, ToolError> {
        let (program, args) =
            self.command.split_first().ok_or_else(|| ToolError::Spawn("the tool's command is empty".into()))?;
        let mut cmd = tokio::process::Command::new(self.program_path().unwrap_or_else(|| program.into()));
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &self.working_dir {
            cmd.current_dir(dir);
        }
        #[cfg(target_os = "linux")]
        {
            let runner = nix::unistd::getpid();
            // SAFETY: between fork and exec the closure makes only
            // async-signal-safe calls and allocates nothing (see
            // group_keeper). The keeper's parent-death signal follows the
            // forking thread: a tokio worker, which lives as long as the
            // runtime the call runs on.
            unsafe {
                cmd.pre_exec(move || super::group_keeper::split_off_the_tool(runner));
            }
        }
        let mut child = cmd.spawn().map_err(|e| ToolError::Spawn(format!("{program}: {e}")))?;
        // The keeper on Linux, the tool elsewhere: the group's leader, whose
        // status is the tool's.
        let group = child.id().map(ProcessGroup);

        let input = serde_json::to_vec(arguments).expect("serializing a Value cannot fail");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let mut out = Vec::new();
        let mut err = StderrTail::default();
        let status = {
            let io = async {
                let write = async move {
                    if let Some(mut stdin) = stdin {
                        // A tool that exits without reading its input is not an error of ours.
                        let _ = stdin.write_all(&input).await;
                    }
                };
                let (_, read, ()) = tokio::join!(
                    write,
                    read_capped(stdout, self.max_response_bytes, &mut out),
                    read_stderr(stderr, &mut err)
                );
                read
            };
            let exit = async {
                let status = child.wait().await;
                // The call ends with the tool: what it left running in its
                // group goes too, and with it the pipes those processes
                // inherited (`helper &` in a script holds stdout open).
                if let Some(group) = &group {
                    group.kill();
                }
                status
            };
            tokio::pin!(io, exit);
            let status = tokio::select! {
                read = &mut io => {
                    // Stop at once on an oversized answer; dropping the call kills the group.
                    read?;
                    exit.await
                }
                status = &mut exit => {
                    // The tool has exited and its answer is in the pipes. A
                    // process that escaped the group (setsid) may still hold
                    // them open: read what is there, not until it exits.
                    if let Ok(read) = tokio::time::timeout(EXIT_DRAIN, &mut io).await {
                        read?;
                    }
                    status
                }
            };
            status.map_err(|e| ToolError::Failed(format!("waiting for {program}: {e}")))?
        };
        let stdout = out;
        let stderr = err.text();
        if !status.success() {
            let stdout = excerpt(&String::from_utf8_lossy(&stdout), STDOUT_QUOTED);
            return Err(ToolError::ExitStatus {
                status: status.to_string(),
                stderr: stderr.trim().to_string(),
                stdout,
            });
        }
        let value: Value = serde_json::from_slice(&stdout).map_err(|e| {
            let text = String::from_utf8_lossy(&stdout);
            ToolError::InvalidJson(format!("{e}; stdout starts with {:?}", excerpt(&text, 120)))
        })?;
        ToolOutput::from_json(value, stdout.len() as u64)
    }
}

/// What [`ExecTool::cannot_start`] found, and in which field it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramProblem {
    /// `command[0]`.
    Program(String),
    /// `workingDir`.
    WorkingDir(String),
}

/// Why `program` (`argv[0]` of a tool or a service) cannot be started, or
/// `None`: a bare name must be an executable on `search` (the `PATH` the
/// process gets; this process's when `None`), anything else must be an
/// executable file at `path` (where `program` resolves). `relative_hint`
/// says where a relative path that is not there was looked for.
pub fn program_problem(
    program: &str,
    path: &Path,
    search: Option<std::ffi::OsString>,
    relative_hint: &str,
) -> Option<String> {
    if !program.contains('/') {
        let search = search.or_else(|| std::env::var_os("PATH")).unwrap_or_default();
        let found = std::env::split_paths(&search).map(|dir| dir.join(program)).any(|p| executable(&p).is_ok());
        return (!found).then(|| {
            format!(
                "{program:?} is not an executable on PATH ({}); install it, or give its path",
                search.to_string_lossy()
            )
        });
    }
    let shown = if Path::new(program).is_relative() {
        format!("{program:?} ({})", path.display())
    } else {
        format!("{program:?}")
    };
    let hint = if path.exists() { String::new() } else { format!("; {relative_hint}") };
    executable(path).err().map(|why| format!("{shown} {why}{hint}"))
}

/// Whether `path` is a file someone may execute, or what it is instead.
fn executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err("does not exist".into()),
        Err(e) => Err(format!("cannot be read: {e}")),
        Ok(meta) if meta.is_dir() => Err("is a directory, not a program".into()),
        Ok(meta) if meta.permissions().mode() & 0o111 == 0 => Err(format!(
            "is not executable (mode {:o}); make it executable (chmod +x) or run it through its interpreter, e.g. [python3, tools/refund.py]",
            meta.permissions().mode() & 0o7777
        )),
        Ok(_) => Ok(()),
    }
}

/// A tool's process group, killed when the call ends (dropped), or as
/// soon as the tool itself exits.
struct ProcessGroup(u32);

impl ProcessGroup {
    fn kill(&self) {
        if let Ok(pgid) = i32::try_from(self.0) {
            // ESRCH (already gone) is the common, fine case.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads all of `stream` into `out`, failing as soon as it passes `limit` bytes.
async fn read_capped(stream: Option<impl AsyncRead + Unpin>, limit: u64, out: &mut Vec<u8>) -> Result<(), ToolError> {
    let Some(mut stream) = stream else { return Ok(()) };
    // On the heap: a buffer in the future would make every call's future 64 KiB larger.
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = stream.read(&mut chunk).await.map_err(|e| ToolError::Failed(format!("reading stdout: {e}")))?;
        if n == 0 {
            return Ok(());
        }
        if out.len() as u64 + n as u64 > limit {
            return Err(ToolError::ResponseTooLarge { limit });
        }
        out.extend_from_slice(&chunk[..n]);
    }
}

/// Keeps the end of stderr (where a traceback's last line is) and drains
/// the rest, so a chatty tool never blocks on a full pipe.
async fn read_stderr(stream: Option<impl AsyncRead + Unpin>, tail: &mut StderrTail) {
    let Some(mut stream) = stream else { return };
    let mut chunk = vec![0u8; 8 << 10];
    while let Ok(n) = stream.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        tail.push(&chunk[..n]);
    }
}

/// The last [`STDERR_KEEP`] bytes of a stream, and whether more came before.
#[derive(Debug, Default)]
struct StderrTail {
    bytes: Vec<u8>,
    cut: bool,
}

impl StderrTail {
    fn push(&mut self, data: &[u8]) {
        self.bytes.extend_from_slice(data);
        // Trimmed in batches, so a byte-by-byte writer costs no quadratic copying.
        if self.bytes.len() > 2 * STDERR_KEEP {
            self.bytes.drain(..self.bytes.len() - STDERR_KEEP);
            self.cut = true;
        }
    }

    /// The kept text, starting on a character boundary, `…` in front when cut.
    fn text(&self) -> String {
        let start = self.bytes.len().saturating_sub(STDERR_KEEP);
        let mut kept = &self.bytes[start..];
        while let [first, rest @ ..] = kept
            && first & 0xC0 == 0x80
        {
            kept = rest;
        }
        let text = String::from_utf8_lossy(kept);
        if self.cut || start > 0 { format!("…{}", text.trim_start()) } else { text.into_owned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_starts_on_a_character_and_says_it_was_cut() {
        let mut tail = StderrTail::default();
        tail.push(b"x");
        for _ in 0..3001 {
            tail.push("é".as_bytes());
        }
        let text = tail.text();
        assert!(text.starts_with("…é"), "{text:?}");
        assert!(!text.contains('\u{fffd}') && !text.contains('x'), "{text:?}");
        assert!(text.len() <= STDERR_KEEP + "…".len(), "{}", text.len());

        let mut short = StderrTail::default();
        short.push(b"db down\n");
        assert_eq!(short.text(), "db down\n");
    }
}
