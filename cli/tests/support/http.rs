//! A `basecamp serve` child process and a GET that sends the path exactly
//! as given (so `..` reaches the server), for the serve and browser tests.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running `basecamp serve`, stopped when dropped.
pub struct Server {
    child: Child,
    pub addr: String,
    /// What it has written to stderr so far (also passed on to the test's stderr).
    stderr: Arc<Mutex<String>>,
}

impl Server {
    pub fn start(dir: &Path) -> Server {
        Self::start_with(&["serve", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"], &[])
    }

    /// `basecamp ARGS` (a `serve` command line) with extra environment variables.
    pub fn start_with(args: &[&str], envs: &[(&str, String)]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_basecamp"))
            .args(args)
            .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("basecamp serve starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let (pipe, seen) = (child.stderr.take().unwrap(), stderr.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("{line}");
                seen.lock().unwrap().push_str(&format!("{line}\n"));
            }
        });
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.trim().strip_suffix('/'))
            .unwrap_or_else(|| panic!("serve printed no URL: {line:?}"))
            .to_string();
        Server { child, addr, stderr }
    }

    /// Everything written to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends SIGTERM, as a pod's end or a service manager would, and waits
    /// (60 s at most) for the exit status.
    #[allow(dead_code)] // not every test binary that includes this module stops its server so
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "serve did not stop within 60 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Response {
    pub status: u16,
    pub headers: String,
    pub body: Vec<u8>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One GET with the path sent exactly as given (no client-side normalising of `..`).
pub fn get(addr: &str, path: &str) -> Response {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete response");
    let headers = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = headers.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if headers.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Response { status, headers, body }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(std::str::from_utf8(&data[..line_end]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[line_end + 2..line_end + 2 + size]);
        data = &data[line_end + 2 + size + 2..];
    }
}
