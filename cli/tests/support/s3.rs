//! The real S3 test server (`basecamp_sandbox::testing`: s3s-fs, installed by
//! `scripts/s3-server.sh install`) on a free loopback port, and the
//! `basecamp` binary pointed at it.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

use basecamp_sandbox::testing::{self, ACCESS_KEY, SECRET_KEY};

// Not every test binary that includes this module names the bucket.
#[allow(unused_imports)]
pub use basecamp_sandbox::testing::BUCKET;

/// The shared s3s-fs server ([`testing::S3Server`]) serving `data` (each
/// directory a bucket; [`BUCKET`] is created); killed on drop.
pub struct S3Server {
    server: testing::S3Server,
}

impl S3Server {
    pub fn start(data: &Path) -> Self {
        Self { server: testing::S3Server::start_on(testing::free_port(), data) }
    }

    /// The environment that points a `basecamp` process at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL_S3", self.server.endpoint()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// `basecamp ARGS` in `dir` against this server.
    pub fn basecamp(&self, args: &[&str], dir: &Path) -> Output {
        basecamp_with_s3(self.server.port, args, dir)
    }
}

/// `basecamp ARGS` in `dir` with the S3 endpoint at 127.0.0.1:`port`
/// (a closed port for failure tests).
pub fn basecamp_with_s3(port: u16, args: &[&str], dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_basecamp"))
        .args(args)
        .current_dir(dir)
        .env("AWS_ENDPOINT_URL_S3", format!("http://127.0.0.1:{port}"))
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .output()
        .expect("the basecamp binary runs")
}
