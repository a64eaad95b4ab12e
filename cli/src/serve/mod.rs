//! `basecamp serve [DIR] --listen ADDR`: the reports, read-only, from a
//! directory (a `basecamp run` output or a tree of them), at stable URLs
//! that status fields and Grafana data links point to:
//!
//! - `/` — the task list;
//! - `/tasks/<namespace>/<task>[?variant=V&metric=M&cluster_by=K]` — metrics
//!   per variant, hints, timeline, correlations, failure clusters;
//! - `/tasks/<namespace>/<task>/episodes/<variant>/<episode>` — one trace;
//! - `/raw/<path>` — a `.trace` (or `.json`) file's bytes.
//!
//! DIR may be an `s3://BUCKET/PREFIX`: its traces and summaries are
//! mirrored into a local directory (`--cache`), refreshed every
//! `--refresh` seconds, and served from there.
//!
//! Every request walks the directory afresh and reads what is new or
//! changed since the last one (`cache`), so a run still writing shows up
//! as it lands without a tree of thousands of traces being read again for
//! every page. Nothing outside DIR is ever read: `/raw/` refuses `..` and
//! any path whose real location (symlinks resolved) leaves DIR, and the
//! walk skips traces and summaries that resolve outside it.

pub mod cache;
pub mod catalog;
pub mod digest;
pub mod episode;
pub mod html;
pub mod insights;
pub mod mirror;
mod pages;

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;

use cache::CatalogCache;
use catalog::Catalog;

/// Serve reports and traces from a directory, read-only.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// A `basecamp run` output directory, a tree of them, or an `s3://BUCKET/PREFIX`
    /// where the operator uploads them (AWS_ENDPOINT_URL_S3 and the usual credentials apply).
    #[arg(default_value = ".")]
    pub dir: String,
    /// Address to listen on (port 0 picks a free port; the URL is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// For an s3:// DIR: the local mirror (default: a new directory under the system's temp dir).
    /// Its `.trace` and `.json` files whose objects are gone from the prefix are removed.
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// For an s3:// DIR: seconds between refreshes of the mirror.
    #[arg(long, default_value_t = 30)]
    pub refresh: u64,
    /// Read every trace again on every request instead of only what changed
    /// (how serve worked before its catalog cache; the peer of `make bench-serve`).
    #[arg(long, hide = true)]
    pub rescan_every_request: bool,
}

struct Served {
    /// The directory, its symlinks resolved: everything served lies below it.
    root: PathBuf,
    cache: CatalogCache,
    rescan_every_request: bool,
}

impl Served {
    /// The catalog as the directory is now.
    fn catalog(&self) -> Arc<Catalog> {
        if self.rescan_every_request { Arc::new(Catalog::scan(&self.root)) } else { self.cache.catalog() }
    }
}

pub fn run(args: ServeArgs) -> Result<ExitCode> {
    // The mirror of an s3:// DIR without --cache is this process's own, removed when it stops,
    // however it stops (an error, a busy port, a signal while the first copy is made). Made
    // before the runtime, so dropped after it: the mirror's refresh has stopped by then.
    let mut temporary_mirror = mirror::RemovedWhenDropped(None);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the runtime")?;
    let dir = if args.dir.starts_with("s3://") {
        let cache = match &args.cache {
            Some(dir) => dir.clone(),
            None => {
                let dir = std::env::temp_dir().join(format!("basecamp-serve-{}", std::process::id()));
                temporary_mirror.0 = Some(dir.clone());
                dir
            }
        };
        let mirror = mirror::Mirror::new(&args.dir, cache)?;
        let first = runtime.block_on(async {
            tokio::select! {
                synced = mirror.sync() => synced,
                () = basecamp_sandbox::driver::ctrl_c_or_sigterm() => bail!("stopped while mirroring {}", args.dir),
            }
        })?;
        basecamp_sandbox::stderr_line!(
            "mirrored {} into {}: {} file(s) fetched, {} unchanged, {} removed (their objects are gone)",
            args.dir,
            mirror.dir.display(),
            first.fetched,
            first.unchanged,
            first.removed
        );
        for refused in &first.refused {
            basecamp_sandbox::stderr_line!("warning: not mirrored: {refused}");
        }
        warn_not_removed(&first);
        let dir = mirror.dir.clone();
        let every = std::time::Duration::from_secs(args.refresh.max(1));
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match mirror.sync().await {
                    Ok(synced) => warn_not_removed(&synced),
                    Err(e) => basecamp_sandbox::stderr_line!(
                        "warning: refreshing the mirror failed (serving what is there): {e:#}"
                    ),
                }
            }
        });
        dir
    } else {
        PathBuf::from(&args.dir)
    };
    let root = dir.canonicalize().with_context(|| format!("{}: cannot serve it: no such directory", dir.display()))?;
    if !root.is_dir() {
        bail!("{}: not a directory; give a `basecamp run` output directory", dir.display());
    }
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr().context("cannot read the listening address")?;
        use std::io::Write as _;
        writeln!(std::io::stdout(), "serving {} at http://{addr}/", root.display())?;
        let _ = std::io::stdout().flush();
        let served =
            Served { cache: CatalogCache::new(root.clone()), root, rescan_every_request: args.rescan_every_request };
        // Ctrl-C or SIGTERM ends it cleanly (SIGTERM's default would skip removing a temporary mirror).
        axum::serve(listener, router(served))
            .with_graceful_shutdown(basecamp_sandbox::driver::ctrl_c_or_sigterm())
            .await
            .context("the server stopped")
    })?;
    drop(runtime); // the mirror's refresh stops before its directory goes
    drop(temporary_mirror);
    Ok(ExitCode::SUCCESS)
}

fn router(served: Served) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/tasks/{namespace}/{task}", get(task))
        .route("/tasks/{namespace}/{task}/episodes/{variant}/{episode}", get(episode))
        .route("/raw/{*path}", get(raw))
        .fallback(|| async { not_found("no such page; start at /") })
        .with_state(Arc::new(served))
}

fn not_found(what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Html(html::page(
            "not found",
            &format!("<h1>404</h1><p>{}</p><p><a href=\"/\">all tasks</a></p>", html::esc(what)),
        )),
    )
        .into_response()
}

fn bad_request(what: &str) -> Response {
    (StatusCode::BAD_REQUEST, Html(html::page("bad request", &format!("<h1>400</h1><p>{}</p>", html::esc(what)))))
        .into_response()
}

/// A deleted object still served is worth a warning at every refresh.
fn warn_not_removed(synced: &mirror::Synced) {
    for kept in &synced.not_removed {
        basecamp_sandbox::stderr_line!(
            "warning: its object is gone but the mirrored file stays (still served): {kept}"
        );
    }
}

/// Runs blocking file work off the async threads.
async fn blocking(work: impl FnOnce() -> Response + Send + 'static) -> Response {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        (StatusCode::INTERNAL_SERVER_ERROR, format!("the page could not be rendered: {e}")).into_response()
    })
}

async fn index(State(s): State<Arc<Served>>) -> Response {
    blocking(move || Html(pages::index(&s.catalog(), &s.root.display().to_string())).into_response()).await
}

/// A path axum could not take apart (not UTF-8 once decoded): no page has it.
fn unreadable_path(rejection: &PathRejection) -> Response {
    not_found(&format!("no page at this path ({})", rejection.body_text()))
}

async fn task(
    State(s): State<Arc<Served>>,
    path: Result<UrlPath<(String, String)>, PathRejection>,
    query: Result<Query<pages::TaskQuery>, QueryRejection>,
) -> Response {
    // The site's own error pages, not axum's plain-text rejections.
    let UrlPath((namespace, task)) = match path {
        Ok(path) => path,
        Err(rejection) => return unreadable_path(&rejection),
    };
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejection) => return bad_request(&rejection.body_text()),
    };
    blocking(move || match pages::task(&s.catalog(), &namespace, &task, &query) {
        None => not_found(&format!("no task {namespace}/{task} under this directory")),
        Some(Err(problem)) => bad_request(&problem),
        Some(Ok(page)) => Html(page).into_response(),
    })
    .await
}

async fn episode(
    State(s): State<Arc<Served>>,
    path: Result<UrlPath<(String, String, String, String)>, PathRejection>,
) -> Response {
    let UrlPath((namespace, task, variant, episode)) = match path {
        Ok(path) => path,
        Err(rejection) => return unreadable_path(&rejection),
    };
    blocking(move || match pages::episode_page(&s.catalog(), &namespace, &task, &variant, &episode) {
        None => not_found(&format!("no episode {variant}/{episode} in task {namespace}/{task}")),
        Some(page) => Html(page).into_response(),
    })
    .await
}

/// Why a `/raw/` path is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// A NUL or a backslash: no file of the tree is called so.
    NotAName,
    /// `..`, an absolute path or a symlink that leads out of the directory.
    Escapes,
    /// Not a `.trace` or `.json` file.
    NotServed,
    Missing,
}

/// The file `/raw/<relative>` names, confined to `root` (already canonical).
pub fn confined(root: &Path, relative: &str) -> Result<PathBuf, Refused> {
    if relative.contains('\0') || relative.contains('\\') {
        return Err(Refused::NotAName);
    }
    let path = Path::new(relative);
    if !path.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(Refused::Escapes);
    }
    let served = path.extension().is_some_and(|e| e == "trace" || e == "json");
    let real = root.join(path).canonicalize().map_err(|_| Refused::Missing)?;
    if !real.starts_with(root) {
        return Err(Refused::Escapes);
    }
    if !served || !real.is_file() {
        return Err(Refused::NotServed);
    }
    Ok(real)
}

async fn raw(State(s): State<Arc<Served>>, path: Result<UrlPath<String>, PathRejection>) -> Response {
    let UrlPath(path) = match path {
        Ok(path) => path,
        Err(rejection) => return unreadable_path(&rejection),
    };
    blocking(move || match confined(&s.root, &path) {
        Err(Refused::NotAName) => bad_request(&format!("{path:?}: not a file name (a NUL or a backslash)")),
        Err(Refused::Escapes) => bad_request(&format!("{path}: the path leaves the served directory")),
        Err(Refused::NotServed) => not_found(&format!("{path}: only .trace and .json files are served")),
        Err(Refused::Missing) => not_found(&format!("{path}: no such file")),
        Ok(file) => match std::fs::read(&file) {
            Ok(bytes) => {
                let kind = if path.ends_with(".json") { "application/json" } else { "application/octet-stream" };
                ([(header::CONTENT_TYPE, kind)], bytes).into_response()
            }
            Err(e) => not_found(&format!("{path}: cannot read: {e}")),
        },
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_paths_stay_inside_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("a/shard-0")).unwrap();
        std::fs::write(root.join("a/shard-0/x.trace"), b"t").unwrap();
        std::fs::write(root.join("a/shard-0/notes.txt"), b"n").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.trace"), b"s").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.trace"), root.join("a/link.trace")).unwrap();

        assert_eq!(confined(&root, "a/shard-0/x.trace"), Ok(root.join("a/shard-0/x.trace")));
        assert_eq!(confined(&root, "../x.trace"), Err(Refused::Escapes));
        assert_eq!(confined(&root, "a/../../x.trace"), Err(Refused::Escapes));
        assert_eq!(
            confined(&root, "a/./shard-0/x.trace"),
            Ok(root.join("a/shard-0/x.trace")),
            "`.` is dropped by components()"
        );
        assert_eq!(confined(&root, "/etc/passwd"), Err(Refused::Escapes));
        assert_eq!(confined(&root, "a/link.trace"), Err(Refused::Escapes));
        assert_eq!(confined(&root, "a\0.trace"), Err(Refused::NotAName));
        assert_eq!(confined(&root, "a/shard-0/notes.txt"), Err(Refused::NotServed));
        assert_eq!(confined(&root, "a/shard-0/none.trace"), Err(Refused::Missing));
    }
}
