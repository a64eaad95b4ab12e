//! `basecamp-operator`: `run` the controller, generate or check the CRDs
//! (`crdgen`), or copy the sandbox binary into a pod's shared volume
//! (`inject-sandbox`, used by the init container).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use basecamp_api::{HarnessTask, SandboxConfig};
use basecamp_operator::controller::cache::{Caches, Watch};
use basecamp_operator::controller::{self, Context};
use basecamp_operator::leader::LeaderElector;
use basecamp_operator::metrics::Metrics;
use basecamp_operator::server::{self, ServerState};
use basecamp_operator::settings::{Settings, parse_sandbox_metrics_from};
use basecamp_operator::{crdgen, inject};
use basecamp_sandbox::storage::{Storage, StorageConfig};
use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

/// Reconciles HarnessTask and SandboxConfig resources into GPU-scheduled sandbox Jobs.
#[derive(Parser)]
#[command(name = "basecamp-operator", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller.
    Run(Box<RunArgs>),
    /// Write one YAML file per CRD into --out, or check --check for drift (exit 1 naming each drifting file).
    Crdgen(CrdgenArgs),
    /// Copy the sandbox binary into a shared volume (the init container of tools-image pods).
    InjectSandbox(InjectArgs),
}

#[derive(clap::Args)]
#[group(required = true, multiple = false)]
struct CrdgenArgs {
    /// Directory to write the CRDs into (e.g. crds).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Directory to compare with what the types generate.
    #[arg(long)]
    check: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Namespaces to watch, comma-separated; empty: all namespaces.
    #[arg(long, env = "BASECAMP_WATCH_NAMESPACES", value_delimiter = ',', default_value = "")]
    namespaces: Vec<String>,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, env = "BASECAMP_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Run only while holding the Lease --lease-name (for several replicas).
    #[arg(long, env = "BASECAMP_LEADER_ELECT")]
    leader_elect: bool,
    /// The leader Lease's name: one per installation (two releases in one namespace sharing a name
    /// would each wait for the other).
    #[arg(long, env = "BASECAMP_LEASE_NAME", default_value = basecamp_operator::leader::DEFAULT_LEASE_NAME)]
    lease_name: String,
    /// The namespace of the leader Lease (the operator's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// This replica's identity in the Lease and in Events (the pod's name).
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// The Basecamp image: sandbox pods run it (and copy the sandbox binary from it into tools images).
    #[arg(long, env = "BASECAMP_SANDBOX_IMAGE", default_value = "basecamp:dev")]
    sandbox_image: String,
    /// A Secret for pulling images, put in the imagePullSecrets of every pod the operator builds; it must
    /// exist in each task's namespace. Repeat the flag (or separate with commas) for several.
    #[arg(long = "sandbox-image-pull-secret", env = "BASECAMP_SANDBOX_IMAGE_PULL_SECRETS", value_name = "NAME", value_delimiter = ',', value_parser = parse_secret_name)]
    sandbox_image_pull_secrets: Vec<String>,
    /// imagePullPolicy of the containers in sandbox and trainer pods that run --sandbox-image (none: Kubernetes' default).
    #[arg(long, env = "BASECAMP_SANDBOX_IMAGE_PULL_POLICY", value_parser = basecamp_operator::settings::IMAGE_PULL_POLICIES)]
    sandbox_image_pull_policy: Option<String>,
    /// An S3-compatible endpoint for the operator and the sandbox pods (none: AWS S3).
    #[arg(long, env = "AWS_ENDPOINT_URL_S3")]
    s3_endpoint: Option<String>,
    /// The S3 region of the operator and the sandbox pods (AWS_REGION; none: each resolves its own).
    #[arg(long, env = "AWS_REGION")]
    s3_region: Option<String>,
    /// A Secret in each task's namespace with the pods' S3 credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
    #[arg(long, env = "BASECAMP_S3_SECRET")]
    s3_secret: Option<String>,
    /// ttlSecondsAfterFinished of the sandbox Jobs (0 to 2147483647, Kubernetes' int32).
    #[arg(long, env = "BASECAMP_JOB_TTL_SECONDS", default_value_t = 604_800, value_parser = clap::value_parser!(i32).range(0..))]
    job_ttl_seconds: i32,
    /// Retries of one shard (backoffLimitPerIndex, 0 or more).
    #[arg(long, env = "BASECAMP_SHARD_RETRIES", default_value_t = 2, value_parser = clap::value_parser!(i32).range(0..))]
    shard_retries: i32,
    /// Where `basecamp serve` runs (e.g. https://basecamp.example.com); status.reportUrl links each task's page.
    #[arg(long, env = "BASECAMP_REPORT_BASE_URL")]
    report_base_url: Option<String>,
    /// Seconds between looks at a training task while its trainer runs or checkpoint evaluations are pending.
    #[arg(long, env = "BASECAMP_CHECKPOINT_POLL_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_poll_seconds: u64,
    /// How long a sandbox pod whose shard is done keeps serving /metrics for a scrape of its final
    /// counts (it exits as soon as one was served): one scrape interval plus margin; 0s: no wait.
    #[arg(long, env = "BASECAMP_SANDBOX_METRICS_LINGER", default_value = "45s", value_parser = basecamp_api::Duration::parse_flag)]
    sandbox_metrics_linger: std::time::Duration,
    /// Who may reach sandbox pods' metrics port 9464 (scrapes, and live injection, served on the same port):
    /// a JSON array of NetworkPolicyPeer objects (podSelector, namespaceSelector, ipBlock), e.g.
    /// [{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]; []: no ingress at all.
    #[arg(long, env = "BASECAMP_SANDBOX_METRICS_FROM", value_name = "JSON", default_value = "[]", value_parser = parse_metrics_from)]
    sandbox_metrics_from: MetricsPeers,
    /// Reconciles in flight at once (per watched namespace). Each is a few API calls; more at once only
    /// queues them at the API server and holds their objects in memory meanwhile.
    #[arg(long, env = "BASECAMP_MAX_CONCURRENT_RECONCILES", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    max_concurrent_reconciles: u16,
    /// Log format (the level comes from RUST_LOG, default info).
    #[arg(long, env = "BASECAMP_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: LogFormat,
}

/// `--sandbox-metrics-from`, parsed. A newtype: clap reads a `Vec` field as
/// a flag given many times, and this is one JSON value.
#[derive(Debug, Clone)]
struct MetricsPeers(Vec<NetworkPolicyPeer>);

/// A Secret's name (a DNS subdomain): a bad one would otherwise fail every
/// Job the operator creates, not its start.
fn parse_secret_name(s: &str) -> Result<String, String> {
    let valid = !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a Secret name (lowercase letters, digits, '-' and '.', at most 253)"))
    }
}

/// Parses `--sandbox-metrics-from`; clap puts the flag's name in front of the message.
fn parse_metrics_from(s: &str) -> Result<MetricsPeers, String> {
    parse_sandbox_metrics_from(s).map(MetricsPeers).map_err(|e| e.to_string())
}

#[derive(clap::Args)]
struct InjectArgs {
    /// The sandbox binary in this image.
    #[arg(long, default_value = basecamp_operator::settings::SANDBOX_BINARY_IN_IMAGE)]
    from: PathBuf,
    /// Where to put it (on the shared volume).
    #[arg(long)]
    to: PathBuf,
}

fn crdgen_command(args: CrdgenArgs) -> ExitCode {
    match (args.out, args.check) {
        (Some(dir), _) => match crdgen::write(&dir) {
            Ok(paths) => {
                for path in paths {
                    println!("wrote {}", path.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error [{}]: {e}", e.category());
                ExitCode::from(2)
            }
        },
        (None, Some(dir)) => match crdgen::check(&dir) {
            Ok(drift) if drift.is_empty() => {
                println!("{}: the CRDs match the types in api/", dir.display());
                ExitCode::SUCCESS
            }
            Ok(drift) => {
                for d in drift {
                    eprintln!("error: {d}");
                }
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("error [{}]: {e}", e.category());
                ExitCode::from(2)
            }
        },
        (None, None) => ExitCode::from(2),
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Completes when SIGTERM or SIGINT arrives.
async fn termination() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => signal,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; only Ctrl-C stops the operator");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as kube::Resource>::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// One controller's watches of the objects it owns and the SandboxConfigs;
/// each also fills a store of `Caches`.
struct Watches {
    jobs: Watch<Job>,
    config_maps: Watch<ConfigMap>,
    network_policies: Watch<NetworkPolicy>,
    sandboxes: Watch<SandboxConfig>,
    services: Watch<Service>,
}

impl Watches {
    fn new(client: &Client, namespace: Option<&str>, caches: &mut Caches) -> Self {
        let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=basecamp-operator");
        Self {
            jobs: caches.watch_jobs(api(client, namespace), owned.clone()),
            config_maps: caches.watch_config_maps(api(client, namespace), owned.clone()),
            network_policies: caches.watch_network_policies(api(client, namespace), owned),
            sandboxes: caches.watch_sandboxes(api(client, namespace), watcher::Config::default()),
            services: caches.watch_services(namespace, watcher::Config::default(), client.clone()),
        }
    }
}

async fn run_controller(
    client: Client,
    namespace: Option<String>,
    watches: Watches,
    concurrency: u16,
    ctx: Arc<Context>,
    stop: watch::Receiver<bool>,
) {
    let ns = namespace.as_deref();
    // The tasks' own watch wakes a task only for a change `task_trigger`
    // sees (not the operator's status writes); the store keeps every version.
    let (reader, writer) = kube::runtime::reflector::store();
    let tasks = watcher(api::<HarnessTask>(&client, ns), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(controller::task_trigger, Default::default());
    let controller = Controller::for_stream(tasks, reader)
        .with_config(kube::runtime::controller::Config::default().concurrency(concurrency));
    let tasks = controller.store();
    let services_ctx = ctx.clone();
    controller
        .owns_stream(watches.jobs)
        .owns_stream(watches.config_maps)
        .owns_stream(watches.network_policies)
        .watches_stream(watches.sandboxes, move |sandbox| controller::tasks_referencing(&tasks.state(), &sandbox))
        .watches_stream(watches.services, move |service| services_ctx.tasks_using(&service))
        .graceful_shutdown_on(stopped(stop))
        .run(controller::reconcile, controller::error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((task, _)) => tracing::debug!(%task, "reconciled"),
                // A task deleted while queued: nothing to do.
                Err(kube::runtime::controller::Error::ObjectNotFound(task)) => {
                    tracing::debug!(%task, "gone before its reconcile")
                }
                Err(error) => tracing::warn!(%error, "controller"),
            }
        })
        .await;
}

/// A reflector of the cluster's nodes (metadata and status), for the GPU
/// capacity check without a list per reconcile. Without RBAC to watch
/// nodes it never becomes ready and the check is skipped with a warning.
fn node_cache(
    client: Client,
    stop: watch::Receiver<bool>,
) -> kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Node> {
    let (reader, writer) = kube::runtime::reflector::store();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client);
    let stream = kube::runtime::reflector(writer, watcher(nodes, watcher::Config::default().any_semantic()))
        .default_backoff()
        .take_until(stopped(stop))
        .for_each(|event| async move {
            if let Err(error) = event {
                tracing::debug!(%error, "node watch");
            }
        });
    tokio::spawn(stream);
    reader
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let client = Client::try_default()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the Kubernetes API (kubeconfig or in-cluster config): {e}"))?;
    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        termination().await;
        let _ = stop_tx.send(true);
    });
    let listener = tokio::net::TcpListener::bind(args.metrics_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (--metrics-addr): {e}", args.metrics_addr))?;
    let state = ServerState { metrics: metrics.clone(), ready: ready.clone() };
    let server = tokio::spawn(server::serve(listener, state, stopped(stop_rx.clone())));
    tracing::info!(addr = %args.metrics_addr, "serving /metrics, /healthz, /readyz");

    let identity = args
        .pod_name
        .clone()
        .unwrap_or_else(|| std::env::var("HOSTNAME").unwrap_or_else(|_| "basecamp-operator".into()));
    let elector = args
        .leader_elect
        .then(|| LeaderElector::new(client.clone(), &args.lease_namespace, &args.lease_name, &identity));
    ready.store(true, Ordering::Relaxed);
    if let Some(elector) = &elector {
        tracing::info!(namespace = %args.lease_namespace, lease = %args.lease_name, %identity, "waiting for the leader Lease");
        tokio::select! {
            acquired = elector.acquire() => acquired.map_err(|e| anyhow::anyhow!("{e}"))?,
            () = stopped(stop_rx.clone()) => return Ok(()),
        }
    }
    let settings = Settings {
        sandbox_image: args.sandbox_image,
        s3_endpoint: args.s3_endpoint.clone(),
        s3_region: args.s3_region.clone(),
        image_pull_secrets: args.sandbox_image_pull_secrets,
        image_pull_policy: args.sandbox_image_pull_policy,
        s3_secret: args.s3_secret,
        job_ttl_seconds: args.job_ttl_seconds,
        backoff_limit_per_index: args.shard_retries,
        report_base_url: args.report_base_url,
        checkpoint_poll_seconds: args.checkpoint_poll_seconds,
        sandbox_metrics_linger: args.sandbox_metrics_linger,
        sandbox_metrics_from: args.sandbox_metrics_from.0,
    };
    let mut storage_config = StorageConfig::from_env();
    if let Some(endpoint) = &args.s3_endpoint {
        storage_config = storage_config.with_endpoint(endpoint.clone());
    }
    if let Some(region) = &args.s3_region {
        storage_config = storage_config.with_region(region.clone());
    }
    let mut context = Context::new(client.clone(), metrics, settings, Storage::new(storage_config), Some(identity));
    context.node_cache = Some(node_cache(client.clone(), stop_rx.clone()));
    let namespaces: Vec<Option<String>> = {
        let named: Vec<String> =
            args.namespaces.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
        if named.is_empty() { vec![None] } else { named.into_iter().map(Some).collect() }
    };
    let watches: Vec<Watches> =
        namespaces.iter().map(|ns| Watches::new(&client, ns.as_deref(), &mut context.caches)).collect();
    let ctx = Arc::new(context);
    tracing::info!(namespaces = ?namespaces, "starting the HarnessTask controller");
    let controllers = futures::future::join_all(namespaces.into_iter().zip(watches).map(|(ns, watches)| {
        run_controller(client.clone(), ns, watches, args.max_concurrent_reconciles, ctx.clone(), stop_rx.clone())
    }));
    let lost = async {
        match &elector {
            Some(elector) => elector.keep().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = controllers => {}
        reason = lost => {
            anyhow::bail!("lost leadership: {reason}; exiting so that a fresh start campaigns again");
        }
    }
    if let Some(elector) = &elector
        && let Err(error) = elector.release().await
    {
        tracing::warn!(%error, "cannot release the Lease; another replica takes over when it expires");
    }
    let _ = server.await;
    tracing::info!("stopped");
    Ok(())
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run(args) => {
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(runtime) => runtime,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Crdgen(args) => crdgen_command(args),
        Command::InjectSandbox(args) => match inject::inject_sandbox(&args.from, &args.to) {
            Ok(bytes) => {
                println!("copied {} ({bytes} bytes) to {}", args.from.display(), args.to.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;

    fn run_args(flags: &[&str]) -> Result<RunArgs, clap::Error> {
        let argv = ["basecamp-operator", "run"].into_iter().chain(flags.iter().copied());
        match Cli::try_parse_from(argv)?.command {
            Command::Run(args) => Ok(*args),
            _ => unreachable!("the run subcommand parses as Command::Run"),
        }
    }

    #[test]
    fn the_lease_name_defaults_to_the_one_every_release_used_and_can_be_set() {
        assert_eq!(run_args(&[]).expect("no flags").lease_name, "basecamp-operator");
        assert_eq!(run_args(&["--lease-name=team-a-basecamp"]).expect("named").lease_name, "team-a-basecamp");
    }

    /// The chart gives each release its own Lease, `<fullname>-operator`:
    /// `basecamp-operator` for the release `basecamp`, the name before the flag.
    #[test]
    fn the_chart_passes_a_lease_name_per_release() {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/basecamp");
        let template = std::fs::read_to_string(chart.join("templates/deployment.yaml")).expect("deployment template");
        assert!(
            template.contains(r#"- --lease-name={{ printf "%s-operator" (include "basecamp.fullname" .) }}"#),
            "the Deployment passes --lease-name from the release's full name"
        );
    }

    #[test]
    fn image_pull_secrets_repeat_and_the_pull_policy_is_kubernetes_own() {
        let args = run_args(&[]).expect("no flags");
        assert!(args.sandbox_image_pull_secrets.is_empty() && args.sandbox_image_pull_policy.is_none());
        let args = run_args(&[
            "--sandbox-image-pull-secret=regcred",
            "--sandbox-image-pull-secret",
            "mirror.io,other",
            "--sandbox-image-pull-policy=Always",
        ])
        .expect("flags");
        assert_eq!(args.sandbox_image_pull_secrets, ["regcred", "mirror.io", "other"]);
        assert_eq!(args.sandbox_image_pull_policy.as_deref(), Some("Always"));
        for bad in ["--sandbox-image-pull-policy=always", "--sandbox-image-pull-secret=Reg_Cred"] {
            let err = run_args(&[bad]).err().expect(bad).to_string();
            assert!(err.contains(bad.split('=').next().unwrap_or(bad)), "{err}");
        }
    }

    /// The chart passes `imagePullSecrets` and `image.pullPolicy` on to the pods the operator builds.
    #[test]
    fn the_chart_passes_pull_secrets_and_policy_to_the_sandbox_pods() {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/basecamp");
        let template = std::fs::read_to_string(chart.join("templates/deployment.yaml")).expect("deployment template");
        for passed in [
            "- --sandbox-image-pull-secret={{ .name }}",
            "- --sandbox-image-pull-policy={{ .Values.image.pullPolicy }}",
        ] {
            assert!(template.contains(passed), "the Deployment passes {passed}");
        }
    }

    /// The chart's `operator.metricsBindAddress` "::" becomes `--metrics-addr=[::]:PORT`.
    #[test]
    fn the_metrics_address_takes_ipv6_in_brackets() {
        let addr = run_args(&["--metrics-addr=[::]:9090"]).expect("IPv6").metrics_addr;
        assert!(addr.is_ipv6() && addr.port() == 9090, "{addr}");
        // A chart flag cannot be given again through extraArgs: the values set it.
        let twice = run_args(&["--metrics-addr=0.0.0.0:8080", "--metrics-addr=[::]:8080"]).err().expect("twice");
        assert!(twice.to_string().contains("--metrics-addr"), "{twice}");
    }

    #[test]
    fn reconciles_in_flight_are_bounded_and_at_least_one() {
        assert_eq!(run_args(&[]).expect("no flags").max_concurrent_reconciles, 16);
        assert_eq!(run_args(&["--max-concurrent-reconciles=4"]).expect("4").max_concurrent_reconciles, 4);
        for bad in ["0", "-1", "many", "70000"] {
            let flag = format!("--max-concurrent-reconciles={bad}");
            let err = run_args(&[&flag]).err().expect(bad).to_string();
            assert!(err.contains("--max-concurrent-reconciles"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_sandbox_metrics_linger_flag_reaches_the_settings_default() {
        let default = run_args(&[]).expect("no flags").sandbox_metrics_linger;
        assert_eq!(default, basecamp_operator::settings::DEFAULT_SANDBOX_METRICS_LINGER);
        assert_eq!(run_args(&["--sandbox-metrics-linger=1m30s"]).expect("1m30s").sandbox_metrics_linger.as_secs(), 90);
        assert_eq!(run_args(&["--sandbox-metrics-linger=0s"]).expect("0s").sandbox_metrics_linger, Duration::ZERO);
        let negative = run_args(&["--sandbox-metrics-linger=-5s"]).err().expect("negative is refused").to_string();
        assert!(negative.contains("0s or more"), "{negative}");
    }

    #[test]
    fn the_sandbox_metrics_from_flag_takes_a_json_array_of_peers() {
        assert!(run_args(&[]).expect("no flags").sandbox_metrics_from.0.is_empty(), "absent: no peers, no ingress");
        assert!(run_args(&["--sandbox-metrics-from=[]"]).expect("[]").sandbox_metrics_from.0.is_empty());
        let monitoring = r#"[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}},
                             {"ipBlock":{"cidr":"10.20.0.0/16"}}]"#;
        let peers = run_args(&["--sandbox-metrics-from", monitoring]).expect("two peers").sandbox_metrics_from.0;
        assert_eq!(peers.len(), 2);
        assert!(peers[0].namespace_selector.is_some() && peers[1].ip_block.is_some());
        for (value, problem) in [
            ("[{", "not JSON"),
            (r#"{"podSelector":{}}"#, "expected a JSON array of NetworkPolicyPeer objects, got an object"),
            (r#"[{"podSelectr":{}}]"#, "[0].podSelectr: unknown field"),
            (r#"[{}]"#, "[0] selects nothing"),
        ] {
            let message = run_args(&["--sandbox-metrics-from", value]).err().expect(value).to_string();
            assert!(message.contains("--sandbox-metrics-from") && message.contains(problem), "{message}");
        }
    }

    /// With the PodMonitor the chart passes `metrics.sandboxPodMonitor.scrapeFrom`
    /// as JSON, and its default parses here and selects Prometheus pods.
    #[test]
    fn the_charts_scrape_from_value_is_passed_and_parses() {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/basecamp");
        let template = std::fs::read_to_string(chart.join("templates/deployment.yaml")).expect("deployment template");
        let passed = "{{- if .enabled }}\n            \
                      - {{ printf \"--sandbox-metrics-from=%s\" (toJson .scrapeFrom) | quote }}\n            \
                      {{- end }}";
        assert!(template.contains(passed), "the Deployment passes metrics.sandboxPodMonitor.scrapeFrom when enabled");
        let values: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(chart.join("values.yaml")).expect("values.yaml"))
                .expect("values.yaml parses");
        let scrape_from = serde_json::to_string(&values["metrics"]["sandboxPodMonitor"]["scrapeFrom"]).expect("json");
        let peers = run_args(&[&format!("--sandbox-metrics-from={scrape_from}")])
            .expect("the operator accepts the chart's default")
            .sandbox_metrics_from
            .0;
        let prometheus = peers.iter().any(|peer| {
            peer.pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.as_ref())
                .is_some_and(|labels| labels.get("app.kubernetes.io/name").is_some_and(|v| v == "prometheus"))
        });
        assert!(prometheus, "the default admits the Prometheus Operator's Prometheus pods: {scrape_from}");
    }

    /// The chart's schema bounds each integer it passes as a flag to what
    /// the flag takes: a value beyond would pass `helm install` and stop the
    /// operator at start.
    #[test]
    fn the_chart_schema_bounds_integer_flags_as_the_operator_does() {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/basecamp");
        let text = std::fs::read_to_string(chart.join("values.schema.json")).expect("values.schema.json");
        let schema: serde_json::Value = serde_json::from_str(&text).expect("values.schema.json parses");
        for (value, flag) in [("jobTtlSeconds", "--job-ttl-seconds"), ("shardRetries", "--shard-retries")] {
            let bounds = &schema["properties"]["sandbox"]["properties"][value];
            let bound = |key: &str| bounds[key].as_i64().unwrap_or_else(|| panic!("sandbox.{value} has a {key}"));
            let (min, max) = (bound("minimum"), bound("maximum"));
            for ok in [min, max] {
                run_args(&[&format!("{flag}={ok}")]).unwrap_or_else(|e| panic!("sandbox.{value}={ok} is refused: {e}"));
            }
            // shardRetries' maximum (100) is the chart's choice, not the type's.
            if max == i64::from(i32::MAX) {
                let err = run_args(&[&format!("{flag}={}", max + 1)]).err().expect("past i32").to_string();
                assert!(err.contains(flag), "{err}");
            }
            let err = run_args(&[&format!("{flag}={}", min - 1)]).err().expect("negative").to_string();
            assert!(err.contains(flag), "{err}");
        }
    }

    /// What the chart's schema takes for `scrapeFrom`, the operator takes:
    /// ci/all-on-values.yaml holds every form of peer the schema allows
    /// (chart-lint renders it), and each parses here.
    #[test]
    fn every_scrape_from_peer_the_chart_schema_takes_parses() {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/basecamp");
        let text = std::fs::read_to_string(chart.join("ci/all-on-values.yaml")).expect("ci/all-on-values.yaml");
        let values: serde_json::Value = serde_saphyr::from_str(&text).expect("ci/all-on-values.yaml parses");
        let scrape_from = &values["metrics"]["sandboxPodMonitor"]["scrapeFrom"];
        let json = serde_json::to_string(scrape_from).expect("json");
        let peers = run_args(&["--sandbox-metrics-from", &json])
            .unwrap_or_else(|e| panic!("the operator refuses what the chart's schema took: {e}"))
            .sandbox_metrics_from
            .0;
        assert_eq!(peers.len(), scrape_from.as_array().map_or(0, Vec::len));
        assert!(peers.iter().any(|p| p.ip_block.as_ref().is_some_and(|b| b.cidr.contains(':'))), "an IPv6 block");
    }

    /// The chart passes `metrics.sandboxPodMonitor.metricsLinger` (0s without
    /// the PodMonitor), and its default parses here and covers the interval.
    #[test]
    fn the_charts_metrics_linger_value_is_passed_and_parses() {
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/basecamp");
        let template = std::fs::read_to_string(chart.join("templates/deployment.yaml")).expect("deployment template");
        assert!(
            template.contains("- --sandbox-metrics-linger={{ if .enabled }}{{ .metricsLinger }}{{ else }}0s{{ end }}")
                && template.contains("{{- with .Values.metrics.sandboxPodMonitor }}"),
            "the Deployment passes metrics.sandboxPodMonitor.metricsLinger"
        );
        let values: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(chart.join("values.yaml")).expect("values.yaml"))
                .expect("values.yaml parses");
        let monitor = &values["metrics"]["sandboxPodMonitor"];
        let as_duration = |key: &str| {
            let text = monitor[key].as_str().unwrap_or_else(|| panic!("sandboxPodMonitor.{key} is a string"));
            basecamp_api::Duration::parse_flag(text).unwrap_or_else(|e| panic!("sandboxPodMonitor.{key}: {e}"))
        };
        let linger = as_duration("metricsLinger");
        let flag =
            run_args(&[&format!("--sandbox-metrics-linger={}", monitor["metricsLinger"].as_str().unwrap_or(""))])
                .expect("the operator accepts the chart's value");
        assert_eq!(flag.sandbox_metrics_linger, linger);
        assert!(
            linger >= as_duration("interval") + as_duration("scrapeTimeout"),
            "metricsLinger must cover one interval and a scrape"
        );
    }
}
